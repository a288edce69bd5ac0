"""linear_attention_apply and linear_attention_scores (sgdiff/kernels/triton/linear_attention_*.py)
under Triton's CPU interpreter: the order of their arithmetic, bit for bit against that order
written out with the interpreter's own fp32 FMA (apply: each h element's head_dim products in
increasing k, the normalizer row alike, + eps, IEEE division, on an fp32 output, and bf16 within
a tolerance of the chain; scores: each score's products in increasing token order, the padding
row's factor the padding value).
apply chains ``tl.fma`` calls (the interpreter's are fp32 FMAs); scores sums with fp32 ``tl.dot`` calls
at IEEE precision, which Triton lowers on the GPU to FMAs, each output's chain in increasing k from
the accumulator given; the interpreter would call numpy's matmul, so here ``tl.dot`` is that chain
(and must be asked at IEEE precision).
Whether cuBLAS's matmul has that order, and Triton's dot that lowering, is the GPU's question
(tests/gpu). Run by tests/test_triton_interpreter.py with TRITON_INTERPRET=1 (skipped without it)."""
import numpy as np
import pytest
import torch

libtriton = pytest.importorskip("triton._C.libtriton")
fma_fp32 = getattr(getattr(libtriton, "interpreter", None), "fma_fp32", None)  # the interpreter's own fp32 FMA
if fma_fp32 is None:
    pytest.skip("this Triton's interpreter has no fp32 FMA to write the order out with", allow_module_level=True)

from sgdiff.kernels.linear_attention_apply import linear_attention_apply_reference as ref  # noqa: E402
from sgdiff.kernels.triton import linear_attention_apply as tapply  # noqa: E402
from sgdiff.kernels.triton import linear_attention_scores as tscores  # noqa: E402
from tests.interpreter.common import assert_within, ids  # noqa: E402

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def fma_chain_dot(monkeypatch):
    """``tl.dot`` as Triton's GPU lowering of an fp32 dot at IEEE precision computes it."""
    from triton.runtime import interpreter

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        assert "IEEE" in str(input_precision).upper(), input_precision  # tf32 would round the operands
        assert a.data.dtype == b.data.dtype == d.data.dtype == np.float32
        acc = d.data
        for k in range(a.data.shape[-1]):
            acc = fma_fp32(*[np.ascontiguousarray(x) for x in np.broadcast_arrays(
                a.data[..., :, k:k + 1], b.data[..., k:k + 1, :], acc)])
        return interpreter.TensorHandle(acc, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", dot)

# [B, heads, head_dim, tokens]: tails, D not a power of 2, k in several steps (80: 32 + 32 + 16)
GEOMETRIES = [(2, 3, 32, 40), (1, 2, 8, 7), (2, 2, 12, 130), (1, 2, 80, 33)]


def operands(B, H, D, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B * H, D + 1, D, generator=g)
    scores[:, -1] = scores[:, -1].abs() + 0.5  # a normalizer away from zero, as v's row of ones gives
    q = (torch.randn(B, N, H * D, generator=g) * 2).to(dtype).transpose(1, 2).unflatten(1, (H, D))
    return scores, q


def in_order(scores, q, eps):
    """h in increasing k with the interpreter's fp32 FMA, normalized and laid out as the op's output."""
    B, H, D, N = q.shape
    s = scores.numpy().reshape(B, H, D + 1, D)
    qf = torch.relu(q).float().numpy()
    acc = np.zeros((B, H, D + 1, N), np.float32)
    for k in range(D):
        acc = fma_fp32(*np.broadcast_arrays(s[:, :, :, k:k + 1], qf[:, :, k:k + 1, :], acc))
    y = acc[:, :, :-1] / (acc[:, :, -1:] + np.float32(eps))
    return torch.from_numpy(np.ascontiguousarray(y)).flatten(1, 2).transpose(1, 2)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=ids)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=ids)
def test_in_increasing_k_bit_for_bit(geometry, dtype):
    scores, q = operands(*geometry, dtype)
    args = (scores, q, 1e-15, torch.float32)
    assert tapply.supported_layout(*args)
    got, want = tapply.linear_attention_apply(*args), in_order(scores, q, 1e-15)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)
    assert_within(tapply.linear_attention_apply(scores, q, 1e-15, torch.bfloat16), ref(scores, q, 1e-15, torch.bfloat16),
                  3e-2)


def test_relu_keeps_nan_and_zeroes_negatives():
    scores, q = operands(1, 1, 8, 5, torch.float32)
    q = q.clone()
    q[0, 0, 0, 0], q[0, 0, 1, 1] = float("nan"), -0.0
    got = tapply.linear_attention_apply(scores, q, 1e-15, torch.float32)
    assert torch.isnan(got[0, 0]).all() and not torch.isnan(got[0, 1:]).any()
    assert torch.equal(got[0, 1:], in_order(scores, q, 1e-15)[0, 1:])


def scores_in_order(v, k, value):
    """pad(v) @ relu(k) in increasing token order with the interpreter's fp32 FMA, [B * H, D + 1, D]."""
    B, H, D, N = v.shape
    vp = np.concatenate([v.float().numpy(), np.full((B, H, 1, N), value, np.float32)], 2)
    kf = torch.relu(k).float().numpy()
    acc = np.zeros((B, H, D + 1, D), np.float32)
    for n in range(N):
        acc = fma_fp32(*np.broadcast_arrays(vp[:, :, :, n:n + 1], kf[:, :, n:n + 1, :], acc))
    return torch.from_numpy(acc).flatten(0, 1)


@pytest.mark.parametrize("geometry", [(2, 3, 32, 40), (1, 2, 8, 7), (2, 2, 40, 19)], ids=ids)  # tokens past the steps
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=ids)
def test_scores_in_increasing_token_order_bit_for_bit(geometry, dtype):
    B, H, D, N = geometry
    g = torch.Generator().manual_seed(1)
    v = (torch.randn(B, N, H * D, generator=g) * 2).to(dtype).transpose(1, 2).unflatten(1, (H, D))
    k = (torch.randn(B, N, H * D, generator=g) * 2).to(dtype).transpose(1, 2).unflatten(1, (H, D)).transpose(2, 3)
    assert tscores.supported_layout(v, k, 1.0)
    got = tscores.linear_attention_scores(v, k, 1.0)
    assert got.is_contiguous() and torch.equal(got, scores_in_order(v, k, 1.0))
    assert torch.equal(tscores.linear_attention_scores(v, k, 0.5), scores_in_order(v, k, 0.5))
