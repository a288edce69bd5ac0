"""Helpers shared by the interpreter tests (tests/interpreter/test_*_interp.py).

The interpreter computes fp32 like the GPU (fma, correctly rounded division) but truncates
fp32 -> bf16 and has no approximate rsqrt, so bf16 results are compared with a tolerance and
exactness is claimed only on the GPU (tests/gpu).
"""
import torch

FP32_BF16 = (torch.float32, torch.bfloat16)


def ids(value):
    """Test ids: a dtype's short name ("float32"), a shape's sizes ("2x3x128"); None (pytest's
    own id) for anything else."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return "x".join(map(str, value))
    return None


def max_err(got, want) -> float:
    return (got.float() - want.float()).abs().max().item()


def assert_within(got, want, rtol):
    """The largest error at most ``rtol`` times the largest magnitude of ``want``."""
    err, scale = max_err(got, want), want.float().abs().max().item()
    assert err <= rtol * scale, (err, scale)


def check(got, want, exact, tol=2 ** -6):
    """The same shape, dtype and strides; then the same bits, or (bf16 under the interpreter:
    truncation, an ulp or two per rounding) within ``tol`` of max(1, max |want|)."""
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    if exact:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        err = max_err(got, want)
        assert err <= tol * max(1.0, want.float().abs().max().item()), err


def drawn(draws, case):
    """The inputs that ``draws``, a generator of (case, inputs), gives ``case``.

    Each module's ``script_draws`` draws its random inputs as the script these tests were drew
    them (one process: seeded once with 0, then every case in turn), stopping at ``case``: each
    test checks the very tensors the script checked. The bf16 tolerances are an ulp or two and
    hold for those, not for every draw: with a seed of its own for each test some fail
    (residual_gate's biased bf16 rows of 1160 exceed 2**-6 for 8 seeds in 40)."""
    for key, inputs in draws:
        if key == case:
            return inputs
    raise KeyError(case)
