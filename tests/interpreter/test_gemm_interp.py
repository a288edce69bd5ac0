"""sgdiff's GEMM under the interpreter: every tile configuration's indexing, persistent tile walk,
second A operand, epilogue halves and gate rows, on operands whose products and sums are exact.

Small integers (|x|, |w| <= 2, K <= 192) keep every partial sum an integer below 2**8, so the
linear's bf16 output is exact whatever order the interpreter adds in, and so are a plain gate's
product and the residual's sum: there the kernel must give the reference's bits, truncation or
not. Activations and tanh/sigmoid gates are not exact in the interpreter's rounding: they are
compared within a tolerance. Bits on the GPU: tests/gpu/test_gemm_gpu.py."""
import itertools

import pytest
import torch

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.triton import gemm
from tests.interpreter.common import check

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


def _ints(*shape, dtype=BF16):
    return torch.randint(-2, 3, shape).to(dtype)


@pytest.fixture
def every_configuration():
    gemm.candidates.append(gemm.SWEEP)
    yield
    gemm.candidates.pop()


def _each_variant(op, args):
    """``[(label, output)]`` of every configuration that takes ``args``, and the reference."""
    impl = registry.op_def(op).triton_impl()
    assert impl.supports(*args)
    return [(label, fn(*args)) for label, fn in impl.variants(*args)], dispatch.reference(op)(*args)


# rows: one tile and a ragged tail; several batch entries whose rows do not split into 128-row tiles
SHAPES = [(1, 64, 64, 128), (1, 130, 128, 192), (2, 131, 192, 320)]


@pytest.mark.parametrize("B,M,K,N", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_every_configuration(every_configuration, B, M, K, N, bias):
    torch.manual_seed(0)
    x, w = _ints(B, M, K), _ints(N, K)
    b = _ints(N) if bias else None
    variants, want = _each_variant("linear", (x, w, b, None))
    assert len(variants) >= 10
    for label, got in variants:
        assert torch.equal(got, want), label


@pytest.mark.parametrize("B,M,K,N", SHAPES)
@pytest.mark.parametrize("gate_rows", ["per_batch", "per_token"])
def test_plain_gated_residual_every_configuration(every_configuration, B, M, K, N, gate_rows):
    """Both gate paths: one gate row a tile (a chunk broadcast over the rows, tiles inside one
    batch entry), and a gate per row (per token, or tiles across batch entries when S % BM)."""
    torch.manual_seed(1)
    x, w, b, residual = _ints(B, M, K), _ints(N, K), _ints(N), _ints(B, M, N)
    gate = _ints(B, M, N) if gate_rows == "per_token" else _ints(B, 6, N)[:, 2:3]
    variants, want = _each_variant("linear_residual_gate", (x, w, b, residual, gate, "plain", None, None))
    assert variants
    for label, got in variants:
        assert torch.equal(got, want), label


def test_cat_operand_and_fp32_gate(every_configuration):
    """``linear(cat([x, x2]))``: the second operand continues K; an fp32 gate, the sum cast back."""
    torch.manual_seed(2)
    x, x2, w, b = _ints(2, 131, 64), _ints(2, 131, 128), _ints(192, 192), _ints(192)
    residual, gate = _ints(2, 131, 192), _ints(2, 3, 192, dtype=torch.float32)[:, 1:2]
    variants, want = _each_variant("linear_residual_gate", (x, w, b, residual, gate, "plain", BF16, x2))
    assert variants
    for label, got in variants:
        assert torch.equal(got, want), label
    variants, want = _each_variant("linear", (x, w, b, x2))
    for label, got in variants:
        assert torch.equal(got, want), label


@pytest.mark.parametrize("act,gate_kind", itertools.product(["gelu_tanh", "gelu", "silu"], ["tanh", "sigmoid"]))
def test_inexact_epilogues_within_tolerance(act, gate_kind):
    torch.manual_seed(3)
    x, w, b = torch.randn(1, 130, 128, dtype=BF16), torch.randn(192, 128, dtype=BF16) / 12, torch.randn(192, dtype=BF16)
    variants, want = _each_variant("linear_act", (x, w, b, act))
    for label, got in variants:
        check(got, want, exact=False)
    residual, gate = torch.randn(1, 130, 192, dtype=BF16), torch.randn(1, 130, 192, dtype=BF16)
    variants, want = _each_variant("linear_residual_gate", (x, w, b, residual, gate, gate_kind, None, None))
    for label, got in variants:  # the interpreter's tanh is another formula: a wider margin
        check(got, want, exact=False, tol=2 ** -5)


@pytest.mark.parametrize("gate_first", [True, False])
@pytest.mark.parametrize("B,M,K,N,bias", [(1, 130, 128, 96, True), (2, 67, 64, 160, False)])
def test_swiglu_halves_every_configuration_within_tolerance(every_configuration, gate_first, B, M, K, N, bias):
    """linear_glu: both halves of the weight (N output columns each: a last tile reaching past the
    first half's end), their biases, the gate first or second; the SiLU within a tolerance."""
    torch.manual_seed(4)
    x, w = torch.randn(B, M, K, dtype=BF16), torch.randn(2 * N, K, dtype=BF16) / 16
    b = torch.randn(2 * N, dtype=BF16) / 4 if bias else None
    variants, want = _each_variant("linear_glu", (x, w, b, gate_first, False))
    assert [label for label, _ in variants][0] == "cublas silu_mul" and len(variants) >= 4
    for label, got in variants:  # the linear's, SiLU's and product's truncations compound: a wider margin
        check(got, want, exact=False, tol=2 ** -5)
    swapped = dispatch.reference("linear_glu")(x, w, b, not gate_first, False)
    assert (variants[1][1].float() - swapped.float()).abs().max() > 0.1  # the other half's gate is no near miss
