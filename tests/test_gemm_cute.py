"""sgdiff's CuTe DSL GEMM (quack's Hopper GEMM with eager's epilogues) on the CPU: what it takes,
and each epilogue and configuration compiled for sm_90a, its PTX holding eager's arithmetic.

Running it needs a Hopper GPU (tests/gpu/test_gemm_cute_gpu.py checks the bits there)."""
import os
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st

from tests.cute_target import COMPILE_ONLY  # before CuTe DSL is imported

pytest.importorskip("quack")

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def sm90_compile(monkeypatch):
    """Compile for sm_90a without a GPU (the target named at import, above), for an H100's 132 SMs
    (the persistent grid's size); yields the folder of the PTX."""
    if not COMPILE_ONLY:
        pytest.skip("compiles for sm_90a where no GPU is present (the GPU tests run the kernels)")
    import quack.gemm_runtime.host as host

    monkeypatch.setattr(host, "get_max_active_clusters", lambda cluster_size, *a, **k: 132 // cluster_size)
    yield os.environ["CUTE_DSL_DUMP_DIR"]


def test_what_it_takes(monkeypatch):
    from sgdiff.kernels.cute import gemm

    monkeypatch.setattr(gemm, "_hopper", lambda index: True)
    meta = dict(device="meta")
    x, w, b = torch.empty(4, 64, 256, dtype=BF16, **meta), torch.empty(384, 256, dtype=BF16, **meta), torch.empty(384, dtype=BF16, **meta)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda t: 0)
    assert gemm.supported(x, w, b) and gemm.supported(x, w, None) and gemm.supported(x, w, b, "gelu_tanh")
    assert gemm.supported(x.to(F16), w.to(F16), b.to(F16), "gelu_tanh")
    assert not gemm.supported(x, w, b, "gelu")  # no epilogue of ATen's erf GELU yet
    assert not gemm.supported(x, w, b.to(F16))  # mixed dtypes
    assert not gemm.supported(x.float(), w.float(), b.float())  # fp32: not a tensor-core dtype here
    assert not gemm.supported(x[..., :252], w[:, :252], b)  # K % 8: rows not 16-byte aligned
    assert not gemm.supported(x, w[:380], b[:380])  # N % 8
    assert not gemm.supported(x.transpose(0, 1), w, b)  # not contiguous
    assert not gemm.supported(x, w, b[:192])  # a bias of another length
    assert not gemm.linear_supported(x, w, b, x)  # the cat operand: the Triton GEMM's
    monkeypatch.setattr(gemm, "_hopper", lambda index: False)
    assert not gemm.supported(x, w, b)  # another architecture's kernel class sees packed pairs


def _ptx(folder, epilogue_name):
    found = [p for p in os.listdir(folder) if p.endswith(".ptx") and f"_{epilogue_name}_" in p]
    assert found, os.listdir(folder)
    return open(os.path.join(folder, found[0])).read()


def _compile(epilogue, dtype, has_bias, config, m=1037, k=320, n=1000):
    x, w, b = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(n).to(dtype)
    operands = {"bias": b[None]} if has_bias else {}
    return epilogue.gemm(x[None], w[None], torch.empty(1, m, n, dtype=dtype), None, epi_args=operands, _launch=False,
                         **config)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_each_epilogue_compiles_for_sm90_with_eagers_arithmetic(sm90_compile, dtype):
    """Every epilogue compiles to sm_90a code (wgmma over TMA-loaded tiles, K unsplit); the GELU's
    PTX is ATen's sequence (the accurate tanhf: ex2 and rcp of the flushing kind, no tanh.approx;
    ATen's constants), the rounding of the projection before it, the bias an add.rn (no FMA)."""
    from sgdiff.kernels.cute import gemm

    first = next(iter(gemm.CONFIGS.values()))
    for act in gemm.ACTS:
        for has_bias in (False, True):
            assert _compile(gemm.linear_epilogue(act, has_bias, dtype), dtype, has_bias, first).split_k == 1
    short = "bf16" if dtype == BF16 else "f16"
    gelu = _ptx(sm90_compile, "gelu_tanh_bias_" + short)
    assert "wgmma.mma_async" in gelu and "cp.async.bulk.tensor" in gelu
    assert "tanh.approx" not in gelu and "ex2.approx.ftz.f32" in gelu and "rcp.approx.ftz.f32" in gelu
    assert ("cvt.rn.bf16.f32" if dtype == BF16 else "cvt.rn.f16.f32") in gelu
    assert "add.rn.f32" in gelu and "0f3D372713" in gelu and "0f3F4C422A" in gelu  # kKappa, kBeta
    bias = _ptx(sm90_compile, "linear_bias_" + short)
    assert re.search(r"add\.rn\.f32", bias) and "wgmma.mma_async" in bias


@pytest.mark.parametrize("case", ["flux", "wan"])
def test_the_gated_residual_compiles_in_eagers_dtypes(sm90_compile, case):
    """Flux: bf16 throughout, the product rounded to bf16 before the sum; Wan: an fp32 gate, the
    product and sum in fp32, cast back to bf16 once (the store)."""
    from sgdiff.kernels.cute import gemm

    m, k, n = 1037, 320, 1000
    x, w, b = torch.randn(1, m, k).to(BF16), torch.randn(n, k).to(BF16), torch.randn(n).to(BF16)
    residual = torch.randn(1, m, n).to(BF16)
    gate = torch.randn(1, 1, n).to(BF16 if case == "flux" else torch.float32)
    out_dtype = None if case == "flux" else BF16
    product, total, out = gemm._residual_dtypes(x, residual, gate, out_dtype)
    assert (product, total, out) == ((BF16, BF16, BF16) if case == "flux" else (torch.float32,) * 2 + (BF16,))
    epilogue = gemm.residual_epilogue(True, BF16, product)
    plan = epilogue.gemm(x, w[None], torch.empty(1, m, n, dtype=out), None, _launch=False,
                         epi_args={"bias": b[None], "residual": residual, "gate": gate.reshape(1, n)},
                         **next(iter(gemm.CONFIGS.values())))
    assert plan.split_k == 1
    ptx = _ptx(sm90_compile, "gated_residual_bias_bf16_" + ("bf16" if case == "flux" else "f32"))
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx and "wgmma.mma_async" in ptx
    assert ptx.count("cvt.rn.bf16.f32") >= (2 if case == "flux" else 1)


@pytest.mark.parametrize("layout", ["batch", "token"])
def test_the_gated_residual_compiles_for_each_gate_layout(sm90_compile, layout):
    """A gate row per batch (a batched launch, the weight a zero-stride view, the bias one row
    for all) and a gate per token (read as a tile) compile with eager's arithmetic."""
    from sgdiff.kernels.cute import gemm

    bsz, m, k, n = 2, 520, 320, 1000
    x, w, b = torch.randn(bsz, m, k).to(BF16), torch.randn(n, k).to(BF16), torch.randn(n).to(BF16)
    residual = torch.randn(bsz, m, n).to(BF16)
    gate = torch.randn(bsz, 6, n).to(BF16).chunk(6, dim=1)[2] if layout == "batch" else torch.randn(bsz, m, n).to(BF16)
    assert gemm.gate_layout(x, w, gate) == layout
    y = torch.empty(bsz, m, n, dtype=BF16)
    a, weights, d, operands = gemm._residual_operands(x, w, b, residual, gate, y)
    assert a.shape[0] == weights.shape[0] == d.shape[0] == (bsz if layout == "batch" else 1)
    assert (weights.stride(0) == 0) == (layout == "batch") and operands["bias"].dim() == (1 if layout == "batch" else 2)
    epilogue = gemm.residual_epilogue(True, BF16, BF16, layout == "token")
    plan = epilogue.gemm(a, weights, d, None, epi_args=operands, _launch=False, **next(iter(gemm.CONFIGS.values())))
    assert plan.split_k == 1
    ptx = _ptx(sm90_compile, "gated_residual_" + ("token_" if layout == "token" else "") + "bias_bf16_bf16")
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx and "wgmma.mma_async" in ptx


@settings(max_examples=60, deadline=None)
@given(batches=st.integers(1, 3), m=st.integers(1, 300), k=st.sampled_from([64, 256, 1536]),
       n=st.sampled_from([128, 192, 1000, 1536]), layout=st.sampled_from(["row", "batch", "token"]),
       gate_dtype=st.sampled_from([BF16, torch.float32]), bias=st.booleans(), two_d=st.booleans())
def test_the_gated_residuals_launch_reads_its_operands_in_place(batches, m, k, n, layout, gate_dtype, bias, two_d):
    """Whatever the batch, rows and gate layout it takes, the launch's operands are views of the
    op's (no copy): A, D and the residual as (L, rows, ·) with L the batches only where the gate has
    a row per batch, the weight shared over L by a zero stride, the gate's rows where they lie."""
    from sgdiff.kernels.cute import gemm

    e = dict(device="meta")
    assume(not (two_d and layout == "batch"))  # a row per batch needs the batch dim
    lead = (m,) if two_d and batches == 1 else (batches, m)
    x, w = torch.empty(*lead, k, dtype=BF16, **e), torch.empty(n, k, dtype=BF16, **e)
    b = torch.empty(n, dtype=BF16, **e) if bias else None
    residual, y = torch.empty(*lead, n, dtype=BF16, **e), torch.empty(*lead, n, dtype=BF16, **e)
    if layout == "row":
        gate = torch.empty(1, 1, n, dtype=gate_dtype, **e)[0] if two_d else torch.empty(1, 1, n, dtype=gate_dtype, **e)
    elif layout == "batch":
        gate = torch.empty(batches, 6, n, dtype=gate_dtype, **e).chunk(6, dim=1)[3]
    else:
        gate = torch.empty(*lead, n, dtype=gate_dtype, **e)
    found = gemm.gate_layout(x, w, gate)
    # one row, however it is spelled, is "row"; a gate per token of one token a batch is a row per batch
    one_token = layout == "token" and x.dim() == 3 and m == 1
    assert found == ("row" if gate.numel() == n else "batch" if one_token else layout)
    a, weights, d, ops = gemm._residual_operands(x, w, b, residual, gate, y)
    rows = batches if found == "batch" else 1
    assert a.shape == (rows, x.numel() // k // rows, k) and d.shape == (rows, a.shape[1], n)
    assert weights.shape == (rows, n, k) and (rows == 1 or weights.stride(0) == 0)
    assert ops["residual"].shape == d.shape
    views = [(a, x), (d, y), (ops["residual"], residual), (ops["gate"], gate)] + ([(ops["bias"], b)] if bias else [])
    assert all(v.untyped_storage() is t.untyped_storage() for v, t in views)  # read in place: no copy
    if found == "token":
        assert ops["gate"].shape == d.shape
    else:
        assert ops["gate"].shape == (rows, n) and ops["gate"].stride(-1) == 1
        assert found != "batch" or one_token or ops["gate"].stride(0) == 6 * n  # each batch's row where the chunk holds it
    assert not bias or ops["bias"].shape == ((n,) if rows > 1 else (1, n))


def test_what_the_gated_residual_takes(monkeypatch):
    from sgdiff.kernels.cute import gemm

    monkeypatch.setattr(gemm, "_hopper", lambda index: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda t: 0)
    e = dict(device="meta")
    x, w, b = torch.empty(1, 64, 256, dtype=BF16, **e), torch.empty(384, 256, dtype=BF16, **e), torch.empty(384, dtype=BF16, **e)
    r, g = torch.empty(1, 64, 384, dtype=BF16, **e), torch.empty(1, 1, 384, dtype=BF16, **e)
    takes = gemm.linear_residual_gate_supported
    assert takes(x, w, b, r, g, "plain") and takes(x, w, None, r, g.float(), "plain", BF16)
    assert takes(x, w, b, r.float(), g.float(), "plain")  # Wan's fp32 stream kept in fp32
    assert not takes(x, w, b, r, g, "tanh")  # another gate function: the Triton GEMM's
    assert not takes(x, w, b, r, g, "plain", torch.float32)  # eager rounds the bf16 sum before this cast
    x2, r2 = torch.empty(2, 64, 256, dtype=BF16, **e), torch.empty(2, 64, 384, dtype=BF16, **e)
    chunks = torch.empty(2, 6, 384, dtype=BF16, **e).chunk(6, dim=1)  # Sana's modulation: rows 6 x 384 apart
    assert takes(x2, w, b, r2, g, "plain") and gemm.gate_layout(x2, w, g) == "row"  # one row for both
    assert takes(x2, w, b, r2, chunks[2], "plain") and gemm.gate_layout(x2, w, chunks[2]) == "batch"
    assert takes(x2, w, b, r2, r2, "plain") and gemm.gate_layout(x2, w, r2) == "token"
    assert takes(x, w, b, r, torch.empty(1, 64, 384, dtype=BF16, **e), "plain")  # per token, a batch of one
    odd = torch.empty(2, 3, 388, dtype=BF16, **e)[..., :384].unsqueeze(1)[:, :, 0]  # rows 3 x 388 apart: unaligned
    assert gemm.gate_layout(x2, w, odd) == "batch" and not takes(x2, w, b, r2, odd, "plain")
    assert not takes(x2, w, b, r2, torch.empty(2, 64, 1, dtype=BF16, **e), "plain")  # a column: not read
    assert not takes(x2, w, b, r.expand(2, 64, 384), g, "plain")  # a residual broadcast over the batch
    assert not takes(x, w, b, r, g, "plain", None, x)  # the cat operand


def test_every_configuration_compiles(sm90_compile):
    from sgdiff.kernels.cute import gemm

    for label, config in gemm.CONFIGS.items():
        plan = _compile(gemm.linear_epilogue("gelu_tanh", True, BF16), BF16, True, config)
        assert (plan.tile_M, plan.tile_N, plan.split_k) == (config["tile_M"], config["tile_N"], 1), label
        assert plan.max_swizzle_size == config.get("max_swizzle_size", 8), label  # a launch argument, not a compile's
    assert "pingpong 128x128 cluster 2x1 swizzle 1" in gemm.CONFIGS


def test_the_sweeps_configurations_compile(sm90_compile, monkeypatch):
    """Every configuration the GEMM bench's sweep times is one quack builds for sm_90a (no GPU
    time spent on one it refuses); first sight takes the sweep's where the bench puts it."""
    from sgdiff.kernels.cute import gemm

    assert set(gemm.CONFIGS) <= set(gemm.SWEEP) and len(gemm.SWEEP) == 42
    for label, config in gemm.SWEEP.items():
        if label not in gemm.CONFIGS:
            plan = _compile(gemm.linear_epilogue(None, True, BF16), BF16, True, config, m=520, k=128, n=512)
            assert (plan.tile_M, plan.tile_N) == (config["tile_M"], config["tile_N"]), label
    monkeypatch.setattr(gemm, "candidates", [None, gemm.SWEEP])
    assert [label for label, _ in gemm.linear_variants(*[torch.empty(8, 64, dtype=BF16)] * 2)] == list(gemm.SWEEP)


def test_the_cats_launch_stores_the_gemm_beside_the_head(monkeypatch):
    """linear_act_cat's launch on the CPU, the GEMM stood in by eager's math: the head's columns
    copied, the GEMM's destination the cat's last N columns in place (its row stride the cat's),
    the result eager's cat; what it takes."""
    from sgdiff.kernels.cute import gemm

    launched = []

    class Epilogue:
        def gemm(self, a, b, d, c, epi_args, **config):
            launched.append(d)
            d.copy_(F.gelu(F.linear(a, b[0], epi_args["bias"][0]), approximate="tanh"))

    monkeypatch.setattr(gemm, "linear_epilogue", lambda *key: Epilogue())
    head = torch.randn(2, 3, 40, 8).to(BF16).transpose(1, 2).flatten(2, 3)
    x, w, b = torch.randn(2, 40, 64).to(BF16), torch.randn(96, 64).to(BF16), torch.randn(96).to(BF16)
    want = torch.cat([head, F.gelu(F.linear(x, w, b), approximate="tanh")], -1)
    for label, run in gemm.linear_act_cat_variants(head, x, w, b, "gelu_tanh"):
        got = run(head, x, w, b, "gelu_tanh")
        d = launched[-1]
        assert torch.equal(got, want) and got.is_contiguous(), label
        assert d.shape == (1, 80, 96) and d.stride() == (80 * 120, 120, 1)
        assert d.untyped_storage() is got.untyped_storage() and d.storage_offset() == 24
    monkeypatch.setattr(gemm, "_hopper", lambda index: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda t: 0)
    takes = gemm.linear_act_cat_supported
    assert takes(head, x, w, b, "gelu_tanh") and takes(head, x, w, None, "gelu_tanh")
    assert not takes(head[..., :20], x, w, b, "gelu_tanh")  # 20 columns: the GEMM's not 16-byte aligned
    assert not takes(head[:1], x, w, b, "gelu_tanh")  # other leading dims
    assert not takes(head.float(), x, w, b, "gelu_tanh")  # another dtype
    assert not takes(head, x, w, b, "gelu")  # ATen's erf GELU: no epilogue yet


def test_the_store_into_the_cat_compiles(sm90_compile):
    """The GELU epilogue storing into a cat's columns (a row stride wider than N) builds for sm_90a."""
    from sgdiff.kernels.cute import gemm

    m, k, n, width = 1037, 320, 1000, 64
    x, w, b = torch.randn(m, k).to(BF16), torch.randn(n, k).to(BF16), torch.randn(n).to(BF16)
    cat = torch.empty(m, width + n, dtype=BF16)
    config = next(iter(gemm.CONFIGS.values()))
    plan = gemm.linear_epilogue("gelu_tanh", True, BF16).gemm(x[None], w[None], cat[:, width:][None], None,
                                                              epi_args={"bias": b[None]}, _launch=False, **config)
    assert (plan.tile_M, plan.tile_N, plan.split_k) == (config["tile_M"], config["tile_N"], 1)
