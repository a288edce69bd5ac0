"""sgdiff's GEMMs on the GPU: every tile configuration gives cuBLAS's bits (F.linear and the
eager chain after it) over shapes with tails, strided operands, bias or not, fp16 and bf16,
each epilogue; tuning settles a verified choice; a wrong GEMM is caught at first sight."""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.registry import Impl, KernelSpec

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("SGDIFF_HYPOTHESIS_EXAMPLES", "12"))


def _impl(op):
    return registry.op_def(op).triton_impl()


def _all_configs_equal(op, args):
    want = dispatch.reference(op)(*args)
    impl = _impl(op)
    assert impl.supports(*args)
    for label, fn in impl.variants(*args):
        got = fn(*args)
        diff = dispatch._first_difference(got, want)
        assert diff is None, (label, diff)


shapes = st.tuples(st.integers(64, 700), st.sampled_from([64, 200, 256, 1000, 1536]),
                   st.sampled_from([64, 136, 384, 1000, 1152]))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, dtype=st.sampled_from([torch.bfloat16, torch.float16]), bias=st.booleans(),
       act=st.sampled_from(["none", "gelu_tanh", "gelu", "silu"]), strided=st.booleans())
def test_linear_and_activation(shape, dtype, bias, act, strided):
    M, K, N = shape
    x = torch.randn(M, K + (64 if strided else 0), device="cuda", dtype=dtype)[:, :K]
    if not strided:
        x = x.view(1, M, K)
    w = torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dtype) if bias else None
    assert torch.equal(dispatch.reference("linear")(x, w, b), F.linear(x, w, b))
    if act == "none":
        _all_configs_equal("linear", (x, w, b, None))
    else:
        _all_configs_equal("linear_act", (x, w, b, act))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, dtype=st.sampled_from([torch.bfloat16, torch.float16]), bias=st.booleans(),
       gate_first=st.booleans(), strided=st.booleans())
def test_swiglu_halves(shape, dtype, bias, gate_first, strided):
    """linear_glu: every configuration (and cuBLAS + silu_mul) gives the SwiGLU chain's bits, each
    half of the weight's rows its own accumulator; output columns N with tails (N % 128)."""
    M, K, N = shape
    N -= N % 8  # whole 16-byte rows of output
    x = torch.randn(M, K + (64 if strided else 0), device="cuda", dtype=dtype)[:, :K]
    w = torch.randn(2 * N, K, device="cuda", dtype=dtype) / K ** 0.5
    b = torch.randn(2 * N, device="cuda", dtype=dtype) if bias else None
    first, second = F.linear(x, w, b).chunk(2, dim=-1)
    chain = F.silu(first) * second if gate_first else first * F.silu(second)
    assert torch.equal(dispatch.reference("linear_glu")(x, w, b, gate_first, False), chain)
    _all_configs_equal("linear_glu", (x, w, b, gate_first, False))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, dtype=st.sampled_from([torch.bfloat16, torch.float16]), bias=st.booleans(),
       gate_kind=st.sampled_from(["plain", "tanh", "sigmoid"]), per_token=st.booleans(), fp32=st.booleans(),
       cat=st.booleans())
def test_residual_gate_epilogue(shape, dtype, bias, gate_kind, per_token, fp32, cat):
    M, K, N = shape
    x = torch.randn(2, M, K, device="cuda", dtype=dtype)
    x2 = torch.randn(2, M, 128, device="cuda", dtype=dtype) if cat and K % 64 == 0 else None
    w = torch.randn(N, K + (128 if x2 is not None else 0), device="cuda", dtype=dtype) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dtype) if bias else None
    gdtype = torch.float32 if fp32 else dtype
    residual = torch.randn(2, M, N, device="cuda", dtype=gdtype)
    gate = (torch.randn(2, M, N, device="cuda", dtype=gdtype) if per_token
            else torch.randn(2, 6, N, device="cuda", dtype=gdtype)[:, 1:2])
    _all_configs_equal("linear_residual_gate", (x, w, b, residual, gate, gate_kind, dtype if fp32 else None, x2))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, dtype=st.sampled_from([torch.bfloat16, torch.float16]), bias=st.booleans(),
       batches=st.sampled_from([1, 2]))
def test_ungated_residual_as_a_gate_of_ones(shape, dtype, bias, batches):
    """``residual + linear(x)`` (the gemm family's ungated residual): the epilogue with a gate of
    ones gives eager's sum of the rounded projection and the residual, bit for bit."""
    M, K, N = shape
    x = torch.randn(batches, M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dtype) if bias else None
    residual = torch.randn(batches, M, N, device="cuda", dtype=dtype)
    ones = torch.full([N], 1.0, device="cuda", dtype=dtype)
    assert torch.equal(dispatch.reference("linear_residual_gate")(x, w, b, residual, ones, "plain"),
                       residual + F.linear(x, w, b))
    _all_configs_equal("linear_residual_gate", (x, w, b, residual, ones, "plain"))


def test_tuning_settles_a_verified_choice(fresh_dispatch):
    x = torch.randn(1, 1024, 1536, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 1536, device="cuda", dtype=torch.bfloat16) / 40
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    op = registry.op_def("linear_act").load()
    want = F.gelu(F.linear(x, w, b), approximate="tanh")
    assert torch.equal(op(x, w, b, "gelu_tanh"), want)
    ((key, (chosen, rows)),) = [(k, v) for k, v in dispatch.tuned_choices().items() if k[0] == "linear_act"]
    assert len(rows) >= 2 and chosen
    assert torch.equal(op(x, w, b, "gelu_tanh"), want)  # the settled choice
    assert not dispatch.disabled()


def test_a_wrong_gemm_is_caught_at_first_sight(fresh_dispatch):
    """An implementation one ulp off drops out; the op keeps the reference's bits."""
    spec = KernelSpec("linear", "wrong", None, "tests.gpu.test_gemm_gpu:WRONG", devices=frozenset({"cuda"}),
                      priority=20)
    spec = registry.register_kernel(__import__("dataclasses").replace(spec, contract=registry.op_def("linear").contract))
    try:
        x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        got = registry.op_def("linear").load()(x, w, None)
        assert torch.equal(got, F.linear(x, w))
        ((_, (chosen, rows)),) = [(k, v) for k, v in dispatch.tuned_choices().items() if k[0] == "linear"]
        assert "wrong" not in [r[0] for r in rows] and not chosen.startswith("wrong")
        assert "triton" in [r[0] for r in rows]  # the Triton GEMM still verified and timed
        # only that implementation of that op dropped out: another op keeps its Triton GEMM
        assert torch.equal(registry.op_def("linear_act").load()(x, w, None, "silu"), F.silu(F.linear(x, w)))
        ((_, (_, rows)),) = [(k, v) for k, v in dispatch.tuned_choices().items() if k[0] == "linear_act"]
        assert "triton" in [r[0] for r in rows] and not dispatch.disabled()
    finally:
        registry._SPECS["linear"].remove(spec)
        registry._generation[0] += 1


def test_operands_the_kernel_does_not_take_run_eagers_gemm(fresh_dispatch):
    """A transposed weight (nn.Linear's weight as a .t() view of [K, N]), rows 2 bytes off a
    16-byte boundary, a strided bias: the kernel refuses them and the op gives cuBLAS's
    bits."""
    x = torch.randn(1, 512, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16).t()  # [768, 1024], strides (1, 768)
    off = torch.randn(512 * 1024 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(1, 512, 1024)
    strided_bias = torch.randn(2 * 768, device="cuda", dtype=torch.bfloat16)[::2]
    wc = w.contiguous()
    for args in ((x, w, None, None), (off, wc, None, None), (x, wc, strided_bias, None)):
        assert not _impl("linear").supports(*args)
        assert torch.equal(registry.op_def("linear").load()(*args), F.linear(*args[:3]))


def _wrong(x, weight, bias=None, x2=None):
    out = F.linear(x, weight, bias)
    return torch.nextafter(out, torch.full_like(out, float("inf")))


WRONG = Impl(run=_wrong)
