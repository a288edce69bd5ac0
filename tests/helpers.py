"""Shared test helpers: what a graph calls, bitwise comparisons, every 16-bit value, the
linear+GELU contract. (Capturing and rewriting a chain: tests/capture.py.)"""
from __future__ import annotations


import torch



def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def count_op(gm, op) -> int:
    return sum(t == op for t in targets(gm))


def every_16bit_value(dtype: torch.dtype, device="cuda") -> torch.Tensor:
    """Each of the 65536 bit patterns of a 16-bit float dtype once (NaNs and infinities included),
    in the order of their bits read as signed integers."""
    return torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32, device=device).to(torch.int16).view(dtype)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs with equal bit patterns compare equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        view = {torch.float32: torch.int32, torch.float16: torch.int16,
                torch.bfloat16: torch.int16, torch.float64: torch.int64}[a.dtype]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


#: linear_gelu_tanh's contract (the registry's doc): the share of max |out| any element may be off
LINEAR_GELU_SHARE = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def assert_linear_gelu_contract(got, want, share):
    """At most 2 ulps off eager where |out| >= 0.1, and ``share`` of max |out| anywhere."""
    mant = 7 if want.dtype == torch.bfloat16 else 10
    got, want = got.float(), want.float()
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - mant)
    large = want.abs() >= 0.1
    err = (got - want).abs()
    ulps = float((err[large] / ulp[large]).max()) if large.any() else 0.0
    assert ulps <= 2, f"{ulps} ulps off eager where |out| >= 0.1"
    assert err.max() <= share * want.abs().max(), f"max error {float(err.max())} of max |out| {float(want.abs().max())}"


def assert_e4m3_rows_close(q, scale, want_q, want_scale, differing=1e-3):
    """e4m3 rows and fp32 row scales a bf16 rounding apart from the wanted ones: each scale within
    2^-7 relative (a row's largest value one bf16 ulp off), each value within one e4m3 step of the
    wanted one (2^-3 relative, 2^-9 among subnormals), and at most ``differing`` of the values
    not equal bit for bit."""
    assert q.shape == want_q.shape and scale.shape == want_scale.shape
    assert float(((scale - want_scale).abs() / want_scale).max()) <= 2 ** -7
    got, want = q.float(), want_q.float()
    step = torch.maximum(want.abs() * 2 ** -3, torch.full_like(want, 2 ** -9))
    assert bool(((got - want).abs() <= step).all()), float(((got - want).abs() / step).max())
    share = float((q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean())
    assert share <= differing, share


#: why a close site stays eager at lossless, as explain reports it
NOT_ADMITTED = "contract close is not admitted at lossless (its numerics are not eager's bit for bit; quality='extra-high' admits it)"


def not_admitted(reason: str, at: str = "lossless") -> bool:
    """Whether a skip's reason is that the tier ``at`` does not admit the op's contract (close or approx)."""
    return reason.startswith("contract ") and f" is not admitted at {at} " in reason


def eager_and_compiled(fn, *args, calls: int = 3):
    """``(fn(*args), the last of calls of fn compiled with backend="sgdiff")``, under no_grad (the
    first call compiles and meets every signature first, the later ones replay what it settled)."""
    with torch.no_grad():
        want = fn(*args)
        compiled = torch.compile(fn, backend="sgdiff")
        for _ in range(calls):
            got = compiled(*args)
    return want, got


def compiled_with_its_report(model, kwargs, reset=True):
    """``model(**kwargs)[0]`` compiled as ``torch.compile(model, backend="sgdiff")`` compiles it
    (the default options' backend), run once under no_grad, and the report of that compile (what
    ``sgdiff.explain`` reports): one compile serves both checks. ``reset``: torch.compile's caches
    cleared before and after (no other test's compiled code is served here, nor this one's later)."""
    from sgdiff import patterns
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options
    from sgdiff.report import Report

    results, options = [], Options.parse({})
    if reset:
        torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, backend=SgdiffBackend(options, on_result=results.append))(**kwargs)[0]
    finally:
        if reset:
            torch._dynamo.reset()
    return got, Report.from_results(options.quality, results, patterns.families())
