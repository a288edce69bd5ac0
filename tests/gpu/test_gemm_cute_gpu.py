"""sgdiff's CuTe DSL GEMM (quack's Hopper GEMM with eager's epilogues) on a Hopper GPU: the GELU
epilogue on every bf16 and fp16 value, every configuration at cuBLAS's and ATen's bits over shapes
with tails, bias or not, both dtypes; first sight verifies and times it beside the Triton GEMM and
cuBLAS; its time against cuBLAS + ATen's GELU at Wan's and Flux's feed-forward shapes (printed)."""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("SGDIFF_HYPOTHESIS_EXAMPLES", "12"))
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper GPU", allow_module_level=True)
pytest.importorskip("quack")

from sgdiff.kernels.cute import gemm  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gelu_epilogue_is_atens_on_every_value(dtype):
    """x @ e0 puts every 16-bit value in the accumulator exactly (a one in B's first column, zeros
    elsewhere); the epilogue's GELU-tanh of it equals ATen's, but for -0 (the sum of products
    is +0) and NaN's payload."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
    x = torch.zeros(65536, 64, dtype=dtype, device="cuda")
    x[:, 0] = values
    w = torch.zeros(192, 64, dtype=dtype, device="cuda")
    w[:, 0] = 1
    want = F.gelu(values, approximate="tanh")
    for label, config in gemm.CONFIGS.items():
        got = gemm.launcher(config, "gelu_tanh", False, dtype)(x, w, None)
        bits = got.view(torch.int16)
        assert torch.equal(bits, bits[:, :1].expand_as(bits)), label  # every column alike (NaN's bits too)
        kept = ~torch.isnan(want) & (values.view(torch.int16) != -32768)
        assert torch.equal(got[:, 0][kept].view(torch.int16), want[kept].view(torch.int16)), label
        assert torch.isnan(got[:, 0][torch.isnan(want)]).all()


shapes = st.tuples(st.integers(64, 700), st.sampled_from([64, 200, 256, 1000, 1536]),
                   st.sampled_from([64, 136, 384, 1000, 1152]))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, dtype=st.sampled_from([torch.bfloat16, torch.float16]), bias=st.booleans(),
       act=st.sampled_from([None, "gelu_tanh"]), batched=st.booleans())
def test_every_configuration_gives_eagers_bits(shape, dtype, bias, act, batched):
    """The shapes tests/gpu/test_gemm_gpu.py checks the Triton GEMM on (cuBLAS does not split K
    there): M with tails, K and N not multiples of the tiles."""
    m, k, n = shape
    x = torch.randn(*((2, m) if batched else (m,)), k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    want = F.linear(x, w, b)
    if act is not None:
        want = F.gelu(want, approximate="tanh")
    assert gemm.supported(x, w, b, act)
    for label, config in gemm.CONFIGS.items():
        got = gemm.launcher(config, act, bias, dtype)(x, w, b)
        assert got.shape == want.shape and torch.equal(got, want), (label, int((got != want).sum()))


def test_first_sight_verifies_and_times_it_beside_cublas(fresh_dispatch):
    from sgdiff.kernels import registry

    x = torch.randn(1, 4096, 1536, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8960, 1536, device="cuda", dtype=torch.bfloat16) / 1536 ** 0.5
    b = torch.randn(8960, device="cuda", dtype=torch.bfloat16)
    got = registry.op_def("linear_act").load()(x, w, b, "gelu_tanh")
    assert torch.equal(got, F.gelu(F.linear(x, w, b), approximate="tanh"))
    (chosen, timed), = [v for (op, _), v in dispatch.tuned_choices().items() if op == "linear_act"]
    backends = {backend for backend, _, _ in timed}
    assert {"reference", "cute"} <= backends and not dispatch.disabled(), (chosen, timed, dispatch.disabled())
    print("linear_act at Wan's FFN up (4096 rows):", chosen, [(bk, lb, round(t * 1e6, 1)) for bk, lb, t in timed])


@pytest.mark.parametrize("shape", [(32760, 1536, 8960), (4096, 3072, 12288), (4608, 3072, 12288)])
def test_times_against_cublas_and_atens_gelu(shape, capsys):
    """GPU µs of each configuration with the GELU against cuBLAS + ATen's GELU and cuBLAS alone,
    alternating in CUDA-graph replays (printed: run with -s)."""
    from bench.timing import gpu_times

    m, k, n = shape
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fns = {"cuBLAS": lambda: F.linear(x, w, b),
           "cuBLAS + GELU": lambda: F.gelu(F.linear(x, w, b), approximate="tanh")}
    for label, config in gemm.CONFIGS.items():
        fns[label] = lambda launch=gemm.launcher(config, "gelu_tanh", True, torch.bfloat16): launch(x, w, b)
    times = gpu_times(fns, calls_per_graph=5, replays=10)
    with capsys.disabled():
        print(f"\n{shape}: " + ", ".join(f"{key} {us:.1f}" for key, us in times.items()))
    assert min(v for key, v in times.items() if not key.startswith("cuBLAS")) > 0


@pytest.mark.parametrize("case", ["flux", "wan", "wan fp32 stream", "sana batch of two", "per-token gate",
                                  "ungated: a gate of ones"])
@pytest.mark.parametrize("m", [700, 4096])
def test_the_gated_residual_gives_eagers_bits(case, m):
    """Flux: bf16 throughout; Wan: (x.float() + ffn.float() * gate).type_as(x) with an fp32 gate;
    an fp32 residual stream kept in fp32; Sana's batch of a prompt and its negative, each with its
    gate row (a chunk of the modulation); a gate per token."""
    from sgdiff.kernels.residual_gate import residual_gate_reference

    k, n = 1536, 1536
    bf16, f32 = torch.bfloat16, torch.float32
    batches = 2 if case in ("sana batch of two", "per-token gate", "ungated: a gate of ones") else 1
    x = torch.randn(batches, m, k, device="cuda", dtype=bf16)
    w = torch.randn(n, k, device="cuda", dtype=bf16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=bf16)
    residual = torch.randn(batches, m, n, device="cuda", dtype=f32 if case == "wan fp32 stream" else bf16)
    if case == "sana batch of two":
        gate = torch.randn(batches, 6, n, device="cuda", dtype=bf16).chunk(6, dim=1)[2]
    elif case == "per-token gate":
        gate = torch.randn(batches, m, n, device="cuda", dtype=bf16)
    elif case.startswith("ungated"):  # residual + linear(x), Wan's cross-attention, as the gemm family passes it
        gate = torch.full([n], 1.0, device="cuda", dtype=bf16)
    else:
        gate = torch.randn(1, 1, n, device="cuda", dtype=bf16 if case.startswith("flux") else f32)
    out_dtype = bf16 if case == "wan" else None
    want = residual_gate_reference(residual, gate, F.linear(x, w, b), "plain", True, None, None, out_dtype)
    if case == "wan":
        assert torch.equal(want, (residual.float() + F.linear(x, w, b).float() * gate).type_as(residual))
    if case in ("flux", "sana batch of two", "per-token gate"):
        assert torch.equal(want, residual + gate * F.linear(x, w, b))
    if case.startswith("ungated"):
        assert torch.equal(want, residual + F.linear(x, w, b))
    args = (x, w, b, residual, gate, "plain", out_dtype)
    assert gemm.linear_residual_gate_supported(*args)
    for label, fn in gemm.linear_residual_gate_variants(*args):
        got = fn(*args)
        assert got.dtype == want.dtype and torch.equal(got, want), (label, int((got != want).sum()))


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=shapes, heads=st.sampled_from([(1, 8), (3, 64), (24, 128)]), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       bias=st.booleans(), batch=st.sampled_from([1, 2]))
def test_the_activation_stored_into_the_cat_gives_eagers_bits(shape, heads, dtype, bias, batch):
    """cat([head, gelu(F.linear(x, w, b))], -1), head a view of attention's [B, H, S, D] output
    laid out [B, S, H D]: every configuration equals eager, head's columns copied, the GEMM's
    stored where the cat holds them (a row stride wider than N)."""
    m, k, n = shape
    h, d = heads
    head = torch.randn(batch, h, m, d, device="cuda", dtype=dtype).transpose(1, 2).flatten(2, 3)
    x = torch.randn(batch, m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    want = torch.cat([head, F.gelu(F.linear(x, w, b), approximate="tanh")], -1)
    assert gemm.linear_act_cat_supported(head, x, w, b, "gelu_tanh")
    for label, fn in gemm.linear_act_cat_variants(head, x, w, b, "gelu_tanh"):
        got = fn(head, x, w, b, "gelu_tanh")
        assert got.is_contiguous() and torch.equal(got, want), (label, int((got != want).sum()))


def test_first_sight_of_the_cat_at_fluxs_shape(fresh_dispatch):
    """Flux single blocks' proj_mlp into the cat: first sight verifies and times the fused GEMM
    beside cuBLAS + gelu_tanh_cat's kernel (printed)."""
    from sgdiff.kernels import registry

    head = torch.randn(1, 24, 4608, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).flatten(2, 3)
    x = torch.randn(1, 4608, 3072, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(12288, 3072, device="cuda", dtype=torch.bfloat16) / 3072 ** 0.5
    b = torch.randn(12288, device="cuda", dtype=torch.bfloat16)
    got = registry.op_def("linear_act_cat").load()(head, x, w, b, "gelu_tanh")
    assert torch.equal(got, torch.cat([head, F.gelu(F.linear(x, w, b), approximate="tanh")], -1))
    (chosen, timed), = [v for (op, _), v in dispatch.tuned_choices().items() if op == "linear_act_cat"]
    assert {"reference", "unfused", "cute"} <= {backend for backend, _, _ in timed}
    print("linear_act_cat at Flux's single block:", chosen, [(bk, lb, round(t * 1e6, 1)) for bk, lb, t in timed])


def test_wans_cross_attention_residual_compiled(fresh_dispatch):
    """``x + attn2.to_out(h)`` at Wan 2.1 1.3B's width, compiled as a user compiles it: one
    linear_residual_gate with a gate of ones, equal to eager; first sight timed it beside cuBLAS +
    the residual kernel and the eager pair (printed)."""
    import sgdiff

    torch.manual_seed(0)
    to_out = torch.nn.Linear(1536, 1536, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 8190, 1536, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1, 8190, 1536, device="cuda", dtype=torch.bfloat16)

    def block(x, h):
        return x + torch.nn.functional.dropout(to_out(h), p=0.0, training=False)

    with torch.no_grad():
        want = block(x, h)
        report = sgdiff.explain(block, x, h)
        got = torch.compile(block, backend="sgdiff")(x, h)
    assert report.family_ops["gemm"] == {"linear_residual_gate": 1}
    assert torch.equal(got, want)
    (chosen, timed), = [v for (op, _), v in dispatch.tuned_choices().items() if op == "linear_residual_gate"]
    assert {"reference", "unfused", "cute"} <= {backend for backend, _, _ in timed}
    print("ungated residual at Wan's cross-attention:", chosen, [(bk, lb, round(t * 1e6, 1)) for bk, lb, t in timed])
