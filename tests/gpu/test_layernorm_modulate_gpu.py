"""layernorm_modulate on CUDA: the Triton kernel is bitwise equal to eager, or is not used."""
import dataclasses
import logging
import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
import triton
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
from sgdiff.kernels.triton import layer_norm as tln
from sgdiff.kernels.triton import layernorm_channels_first as tcf, layernorm_modulate as tk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dispatch")]
OP = registry.op_def("layernorm_modulate").load()


def eager(x, w, b, eps, scale, shift):
    y = F.layer_norm(x, x.shape[-1:], w, b, eps) * (1 + scale)
    return y + shift if shift is not None else y


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


# Real DiT shapes: Sana 1.6B, PixArt-Sigma, Flux.1-dev, SD3.5-large, Wan 2.1 1.3B / 14B
REAL = [(2, 1024, 2240), (2, 4096, 1152), (1, 4608, 3072), (1, 4429, 2432), (1, 32760, 1536), (1, 32760, 5120)]


@pytest.mark.parametrize("shape", REAL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("kernel", ["warp_row", "row_in_registers", "row_read_again"])
def test_real_shapes_bitexact(shape, dtype, affine, kernel, monkeypatch):
    # every kernel and way, whichever the shape picks
    monkeypatch.setattr(tk, "_warp_row", lambda *_: kernel == "warp_row")
    monkeypatch.setattr(tk, "_keep_row", lambda *_: kernel == "row_in_registers")
    B, S, N = shape
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3 + 1
    emb = torch.randn(B, 6 * N, device="cuda", dtype=dtype)
    shift, scale = emb[:, None].chunk(6, dim=-1)[:2]
    w = torch.randn(N, device="cuda", dtype=dtype) if affine else None
    b = torch.randn(N, device="cuda", dtype=dtype) if affine else None
    args = (x, w, b, 1e-6, scale, shift, True)
    assert tk.can_use(*args)
    got = tk.layernorm_modulate(*args)
    want = eager(x, w, b, 1e-6, scale, shift)
    assert torch.equal(bits(got), bits(want)), f"{int((got != want).sum())} of {got.numel()} differ"


@pytest.mark.parametrize("shape", REAL[:3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("keep,group,s_const,ahead,early", [
    (True, 1, False, 0, 0), (False, 1, True, 0, 0), (False, 2, False, 0, 0), (False, 6, True, 0, 0),
    (True, 6, True, 0, 0), (True, 1, False, 1, 0), (True, 1, False, 1, 1), (True, 1, False, 1, 2),
    (False, 1, True, 2, 0), (False, 2, True, 1, 2)])
def test_warp_row_second_pass_modes_bitexact(shape, dtype, affine, keep, group, s_const, ahead, early, monkeypatch):
    """Every way of the warp-row kernel's second pass, whichever the shape picks."""
    monkeypatch.setattr(tk, "_warp_row_second_pass", lambda rows, S, *_: dict(
        KEEP_ROW=keep, GROUP=group, S_CONST=S if s_const else 0, AHEAD=ahead, EARLY=early))
    B, S, N = shape
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3 + 1
    shift, scale = torch.randn(B, 6 * N, device="cuda", dtype=dtype)[:, None].chunk(6, dim=-1)[:2]
    w, b = (torch.randn(N, device="cuda", dtype=dtype) for _ in range(2)) if affine else (None, None)
    got = tk.layernorm_modulate(x, w, b, 1e-6, scale, shift, True)
    want = eager(x, w, b, 1e-6, scale, shift)
    assert torch.equal(bits(got), bits(want)), f"{int((got != want).sum())} of {got.numel()} differ"


@pytest.mark.parametrize("shape", [(2, 1024, 2240), (1, 32760, 1536), (1, 32760, 5120)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wan_casts_bitexact(shape, dtype):
    """Wan: (norm1(x.float()) * (1 + scale) + shift).type_as(x) with fp32 table + temb
    parameters, and the cross-attention's FP32LayerNorm, norm2(x.float()).type_as(x): the op
    reads x and writes x's dtype, bitwise as the fp32 chain and its casts."""
    B, S, N = shape
    x = torch.randn(shape, device="cuda").to(dtype) * 3 + 1
    table, temb = torch.randn(1, 6, N, device="cuda") / N ** 0.5, torch.randn(B, 6, N, device="cuda").to(dtype)
    shift, scale = (table + temb.float()).chunk(6, dim=1)[:2]
    args = (x, None, None, 1e-6, scale, shift, True, torch.float32, dtype)
    assert tk.can_use(*args)
    want = (F.layer_norm(x.float(), (N,), eps=1e-6) * (1 + scale) + shift).type_as(x)
    got = OP(*args)
    assert got.dtype == dtype and torch.equal(bits(got), bits(want)), f"{int((got != want).sum())} differ"
    w, b = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    want = F.layer_norm(x.float(), (N,), w, b, 1e-6).type_as(x)
    got = registry.op_def("layer_norm").load()(x, w, b, 1e-6, torch.float32, dtype)
    assert torch.equal(bits(got), bits(want))
    assert not dispatch.disabled(), dispatch.disabled()


layouts = st.sampled_from(["contiguous", "chunk_view", "transposed", "misaligned", "per_token", "vector"])


@settings(max_examples=int(os.environ.get("SGDIFF_GPU_EXAMPLES", "60")), deadline=None)
# N % 4 != 0 takes ATen's other kernel (sgdiff must fall back); N % 64 == 0 up to 3072, the warp-row kernel
@given(B=st.integers(1, 3), S=st.integers(1, 300), N=st.one_of(st.integers(2, 2800), st.integers(1, 48).map(lambda k: 64 * k)),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), layout=layouts,
       shift=st.booleans(), affine=st.sampled_from(["", "w", "b", "wb"]), eps=st.sampled_from([1e-6, 1e-5]),
       casts=st.booleans(), four_warps=st.booleans())
def test_any_layout_is_exact_or_falls_back(B, S, N, dtype, layout, shift, affine, eps, casts, four_warps):
    """With ``casts`` (a bf16/fp16 x): Wan's fp32 chain, ``(norm(x.float()) ...).type_as(x)``.
    These rows are few and short: the warp-row kernel's, unless ``four_warps`` (the 4-warp
    kernel, called directly where it applies)."""
    g = torch.Generator(device="cuda").manual_seed(B * 1000 + S)
    x = (torch.randn(B, S, N + 1, device="cuda", generator=g) * 2).to(dtype)
    if layout == "transposed":
        x = x[..., :N].transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "misaligned":
        x = x.flatten()[1:1 + B * S * N].view(B, S, N)  # contiguous, storage offset of one element
    elif layout == "chunk_view":
        x = x[..., :N]
    else:
        x = x[..., :N].contiguous()
    pshape = (B, S, 2 * N) if layout == "per_token" else (B, 1, 2 * N) if layout != "vector" else (2 * N,)
    casts = casts and dtype != torch.float32
    pdtype = torch.float32 if casts else dtype
    params = torch.randn(pshape, device="cuda", generator=g).to(pdtype)
    sc, sh = params.chunk(2, dim=-1)
    w = torch.randn(N, device="cuda", generator=g).to(pdtype) if "w" in affine else None
    b = torch.randn(N, device="cuda", generator=g).to(pdtype) if "b" in affine else None
    args = (x, w, b, eps, sc, sh if shift else None, True) + ((torch.float32, dtype) if casts else ())
    want = eager(x.float() if casts else x, w, b, eps, sc, sh if shift else None).to(dtype)
    if four_warps and tk.can_use(*args):
        with mock.patch.object(tk, "_warp_row", lambda *_: False):
            got = tk.layernorm_modulate(*args)
    else:
        got = OP(*args)
    assert torch.equal(bits(got), bits(want))
    assert not dispatch.disabled(), dispatch.disabled()


def test_wrong_kernel_is_caught_and_disabled_alone(monkeypatch, caplog):
    spec = next(s for s in registry.kernel_specs("layernorm_modulate") if s.backend == "triton")
    real = dispatch._load(spec)

    def wrong(*args):
        return real.run(*args) + 1  # visibly wrong in any dtype

    wrong_impl = dataclasses.replace(real, run=wrong)
    monkeypatch.setattr(dispatch, "_load", lambda s: wrong_impl if s is spec else s.load())
    x = torch.randn(2, 64, 1152, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(2, 1, 1152, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="sgdiff"):
        out = OP(x, None, None, 1e-6, s, s, True)
    assert torch.equal(out, eager(x, None, None, 1e-6, s, s))  # the reference answered
    assert list(dispatch.disabled()) == [("layernorm_modulate", "triton")]
    assert "not bit-exact" in caplog.text and "layernorm_modulate" in caplog.text
    assert caplog.text.count("disabled") == 1


def test_raising_kernel_falls_back(monkeypatch):
    spec = next(s for s in registry.kernel_specs("layernorm_modulate") if s.backend == "triton")

    def boom(*args):
        raise RuntimeError("injected")

    monkeypatch.setattr(dispatch, "_load", lambda s: registry.Impl(run=boom) if s is spec else s.load())
    x = torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(2, 1, 64, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(OP(x, None, None, 1e-6, s, s, True), eager(x, None, None, 1e-6, s, s))
    assert "raised RuntimeError" in dispatch.disabled()[("layernorm_modulate", "triton")]


def test_nan_and_inf_inputs_disable_nothing():
    x = torch.randn(2, 64, 1152, device="cuda", dtype=torch.bfloat16)
    x[0, 3, 7] = float("nan")
    x[1, 5, 9] = float("inf")
    s = torch.randn(2, 1, 1152, device="cuda", dtype=torch.bfloat16)
    out = OP(x, None, None, 1e-6, s, s, True)
    want = eager(x, None, None, 1e-6, s, s)
    assert torch.equal(out[~want.isnan()], want[~want.isnan()])
    assert not dispatch.disabled()


def test_capture_of_an_unverified_signature_runs_the_reference():
    x = torch.randn(2, 64, 1152, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(2, 1, 1152, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = OP(x, None, None, 1e-6, s, s, True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager(x, None, None, 1e-6, s, s))
    assert not dispatch._verified  # nothing was verified inside the capture


@settings(max_examples=int(os.environ.get("SGDIFF_GPU_EXAMPLES", "60")), deadline=None)
@given(B=st.integers(1, 2), S=st.integers(1, 300), H=st.integers(1, 24), D=st.sampled_from([64, 72, 128, 256]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       layout=st.sampled_from(["contiguous", "heads_first", "qkv_chunk"]), affine=st.booleans(),
       casts=st.booleans())
def test_per_head_layer_norm(B, S, H, D, dtype, layout, affine, casts):
    """sgdiff::layer_norm (QK LayerNorm over head_dim): bitwise F.layer_norm on every layout, the
    strided ones copied contiguous first as eager does; with ``casts`` an FP32LayerNorm,
    ``F.layer_norm(x.float(), ..., w32, b32).to(x.dtype)``."""
    casts = casts and dtype != torch.float32
    if layout == "qkv_chunk":
        x = torch.randn(B, S, 3 * H * D, device="cuda").to(dtype)[..., H * D:2 * H * D].unflatten(-1, (H, D))
    else:
        x = torch.randn(B, S, H, D, device="cuda").to(dtype)
    if layout == "heads_first":
        x = x.transpose(1, 2)
    pdtype = torch.float32 if casts else dtype
    w, b = (torch.randn(D, device="cuda").to(pdtype), torch.randn(D, device="cuda").to(pdtype)) if affine else (None, None)
    cast_args = (torch.float32, dtype) if casts else (None, None)
    want = F.layer_norm(x.to(pdtype), (D,), w, b, 1e-6).to(dtype)
    assert tln.layer_norm_can_use(x, w, b, 1e-6, *cast_args)
    got = registry.op_def("layer_norm").load()(x, w, b, 1e-6, *cast_args)
    assert torch.equal(bits(got), bits(want)) and got.is_contiguous()
    assert not dispatch.disabled(), dispatch.disabled()


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_head_layer_norm_tiny_and_cancelling_rows(D, dtype):
    """Per-head rows against eager where the lane tree's rounding is most fragile: whole
    programs of tiny rows, a tiny row beside ordinary ones, lanes that cancel, and
    subnormal-sized partial means."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 8, D, device="cuda", generator=g)
    x[0:16] *= 1e-38                                 # a whole program of tiny rows
    x[20] *= 1e-38                                   # one tiny row among ordinary ones
    x[33, :, :D // 2] = 1e-37
    x[33, :, D // 2:] = -1e-37                       # lanes that cancel to tiny partial means
    x[40, :, 0::2] = 3.0e-30
    x[40, :, 1::2] = -2.9e-30
    x[50] = torch.randint(-3, 4, (8, D), device="cuda", generator=g) * 2.0 ** -60
    x = x.to(dtype)
    for w, b in ((None, None), (torch.randn(D, device="cuda", generator=g).to(dtype), None)):
        got, want = tln.layer_norm(x, w, b, 1e-6), F.layer_norm(x, (D,), w, b, 1e-6)
        assert torch.equal(bits(got), bits(want))


def _short_rows(kernel, x, w, b, rows, warps):
    M, N = x.shape
    out = torch.empty_like(x)
    options = (tln.warp_rows_options(M, N, rows, warps) if kernel is tln._layer_norm_warp_rows_kernel
               else dict(ROWS=rows, num_warps=warps))
    kernel[(triton.cdiv(M, rows),)](x, w if w is not None else x, b if b is not None else x, out, M, N, 1e-6,
                                    HAS_WEIGHT=w is not None, HAS_BIAS=b is not None, DTYPE=tln.TL_DTYPE[x.dtype],
                                    INTERPRET=False, enable_fp_fusion=False, **options)
    return out


@pytest.mark.skipif(tln._layer_norm_warp_rows_kernel is None, reason="needs Triton's Gluon")
@pytest.mark.parametrize("D", [4, 8, 12, 36, 64, 72, 96, 100, 124, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_warp_rows_kernel_every_head_dim_and_program_shape(D, dtype):
    """The Gluon per-head kernel (a row per 8 lanes, the tree's first two levels in registers,
    the last three a butterfly, the first lane's state broadcast) against eager at head dims
    with idle lanes and unequal counts in the tree, at several rows per program and warp
    counts, with a partial last program; and the Triton short-rows kernel on the same rows."""
    g = torch.Generator(device="cuda").manual_seed(D)
    x = (torch.randn(1000, D, device="cuda", generator=g) * 3 + 0.5).to(dtype)
    x[7] = 0.0
    x[9, : D // 2] *= 1e-30
    for w, b in ((None, None), (torch.randn(D, device="cuda", generator=g).to(dtype),
                                torch.randn(D, device="cuda", generator=g).to(dtype))):
        want = bits(F.layer_norm(x, (D,), w, b, 1e-6))
        for rows, warps in ((8, 1), (16, 2), (16, 4), (32, 4), (64, 4), (32, 8), (64, 8)):
            got = _short_rows(tln._layer_norm_warp_rows_kernel, x, w, b, rows, warps)
            assert torch.equal(bits(got), want), (rows, warps)
        for rows, warps in ((16, 2), (32, 8)):  # rows that fill every program: no row mask
            got = _short_rows(tln._layer_norm_warp_rows_kernel, x[:992], w, b, rows, warps)
            assert torch.equal(bits(got), want[:992]), (rows, warps)
        assert torch.equal(bits(_short_rows(tln._layer_norm_short_rows_kernel, x, w, b, 16, 4)), want)


@pytest.mark.parametrize("shape", [(2, 1152, 4096), (1, 3072, 333), (2, 64, 7), (1, 516, 77)])  # [B, N, S]
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("form", ["plain", "affine", "weight_no_shift", "wan_casts"])
def test_channels_first_storage_bitexact(shape, dtype, form):
    """``LayerNorm(x) * (1 + scale) + shift`` of ``x = y.transpose(1, 2)``: the rows normalized
    where they lie (no copy), ATen's bits after its contiguous copy; an affine LayerNorm, a
    weight alone without a shift, and Wan's fp32 norm of a bf16 x cast back."""
    g = torch.Generator(device="cuda").manual_seed(11)
    B, N, S = shape
    x = (torch.randn(*shape, device="cuda", generator=g) * 3 + 1).to(dtype).transpose(1, 2)
    norm = torch.float32 if form == "wan_casts" else dtype
    scale, shift, w, b = (torch.randn(*s, device="cuda", generator=g).to(norm)
                          for s in ((B, 1, N), (B, 1, N), (N,), (N,)))
    w, b = (w, b) if form == "affine" else (w, None) if form == "weight_no_shift" else (None, None)
    shift = None if form == "weight_no_shift" else shift
    casts = (torch.float32, dtype) if form == "wan_casts" else (None, None)
    args = (x, w, b, 1e-6, scale, shift, True, *casts)
    assert tk.can_use(*args) and tcf.supported(x)
    want = layernorm_modulate_reference(*args)
    got = tk.layernorm_modulate(*args)
    assert dispatch._first_difference(got, want) is None
