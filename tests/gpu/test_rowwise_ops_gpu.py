"""rope, rope_even_odd, rms_norm (both forms), rms_norm_rope, rmsnorm_modulate, silu_mul,
gelu_tanh_cat and the convolution epilogues (conv_silu, conv_silu_mul) on CUDA: each Triton
kernel is bitwise equal to the eager chain as diffusers writes it, or is not used."""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.layout import same_strides
from sgdiff.kernels.triton import gelu_tanh_cat as tgelu, rms_norm as trms, rms_norm_rope as trr, rope as trope
from sgdiff.kernels.triton import cast_copy as tcast, conv_silu as tconv, linear_attention_out as tlao
from sgdiff.kernels.triton import rmsnorm_modulate as trmod, silu_mul as tsilu
from tests.helpers import every_16bit_value

pytestmark = pytest.mark.gpu
EXAMPLES = int(os.environ.get("SGDIFF_GPU_EXAMPLES", "40"))
op = {name: registry.op_def(name).load() for name in ("rope", "rope_even_odd", "rms_norm", "silu_mul",
                                                                "gelu_tanh_cat", "rms_norm_rope", "rms_norm_cat_rope",
                                                                "conv_silu", "conv_silu_mul", "cast_copy",
                                                                "linear_attention_out", "modulate", "rmsnorm_modulate")}


def same_layout(got, want):
    """Equal strides where they matter (a dim of size 1 may have any stride)."""
    return same_strides(got.shape, got.stride(), want.stride())


@pytest.fixture(autouse=True)
def no_kernel_disabled(fresh_dispatch):
    yield
    assert not dispatch.disabled(), dispatch.disabled()


def randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def wan_rope(x, freqs_cos, freqs_sin):
    """diffusers WanAttnProcessor's apply_rotary_emb."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


# Flux.1-dev q/k (and its text stream), Qwen-Image-sized, CogVideoX-sized
@pytest.mark.parametrize("shape", [(1, 4608, 24, 128), (1, 512, 24, 128), (2, 4096, 24, 128), (1, 17550, 48, 64)])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rope_real_shapes(shape, interleaved, dtype):
    from diffusers.models.embeddings import apply_rotary_emb

    B, S, H, D = shape
    x, cos, sin = randn(*shape, dtype=dtype), randn(S, D, dtype=torch.float32), randn(S, D, dtype=torch.float32)
    want = apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=-1 if interleaved else -2, sequence_dim=1)
    args = (x, cos[None, :, None], sin[None, :, None], interleaved)
    assert trope.can_use(*args)
    assert torch.equal(trope.rope(*args), want)


@pytest.mark.parametrize("shape", [(1, 32760, 12, 128), (1, 32760, 40, 128), (2, 1560, 12, 128)])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_rope_even_odd_real_shapes(shape, table_dtype):
    B, S, H, D = shape
    x = randn(*shape)
    fcos, fsin = randn(1, S, 1, D, dtype=table_dtype), randn(1, S, 1, D, dtype=table_dtype)
    want = wan_rope(x, fcos, fsin)
    args = (x, fcos[..., 0::2], fsin[..., 1::2])
    assert trope.can_use_even_odd(*args)
    got = trope.rope_even_odd(*args)
    assert torch.equal(got, want) and same_layout(got, want)


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _matrix_chain(form, x, table):
    """Kandinsky 6's apply_rotary (the sum) or PRX's apply_rope (the select form)."""
    if form == "sum":
        return (table.float() * x.reshape(*x.shape[:-1], -1, 1, 2).float()).sum(dim=-1).reshape(*x.shape).to(x.dtype)
    x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    return (table[..., 0] * x_[..., 0] + table[..., 1] * x_[..., 1]).reshape(*x.shape).type_as(x)


# Kandinsky 6 and PRX q (tokens first, and heads-first storage); an eighth of the tokens zero (padding):
# their products are -0 where the table is negative, so the sum's +0 against the add's -0 is checked
# bit for bit (torch.equal takes -0 for +0)
@pytest.mark.parametrize("shape,heads_first", [((1, 8192, 14, 128), False), ((2, 4096, 28, 64), True)])
@pytest.mark.parametrize("form", ["sum", "select"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_matrix_real_shapes(shape, heads_first, form, dtype):
    B, S, H, D = shape
    x = randn(B, H, S, D, dtype=dtype).transpose(1, 2) if heads_first else randn(*shape, dtype=dtype)
    x[:, : S // 8] = 0
    angle = torch.randn(1, S, 1, D // 2, device="cuda")
    table = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], -1).view(1, S, 1, D // 2, 2, 2)
    want = _matrix_chain(form, x, table)
    args = (x, table, form == "sum", None, dtype)
    assert trope.can_use_matrix(*args)
    got = trope.rope_matrix(*args)
    assert torch.equal(_bits(got), _bits(want)) and same_layout(got, want)
    assert torch.signbit(want[:, : S // 8]).any() == (form == "select")  # the case is in the data


# Flux/Qwen-Image q (head 128), SD3.5 q as [B, H, S, D] views (head 64), odd sizes with tails
@pytest.mark.parametrize("shape,transposed", [((1, 4608, 24, 128), False), ((2, 4096, 38, 64), True),
                                              ((1, 4096, 24, 128), True), ((3, 77, 5, 96), False),
                                              ((2, 333, 3, 256), False), ((1, 1000, 1, 3072), False)])
@pytest.mark.parametrize("weight", ["bf16", "fp32", None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_diffusers_real_shapes(shape, transposed, weight, dtype):
    from diffusers.models.normalization import RMSNorm

    x = randn(*shape, dtype=dtype, scale=3.0)
    if transposed:
        x = x.transpose(1, 2)
    D = shape[-1]
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=weight is not None).cuda()
    if weight is not None:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(D, device="cuda"))
        norm.to(torch.bfloat16 if weight == "bf16" else torch.float32)
    with torch.no_grad():
        want = norm(x)
    args = (x, None if weight is None else norm.weight.detach(), 1e-6, "diffusers")
    assert trms.can_use(*args)
    got = trms.rms_norm(*args)
    assert got.dtype == want.dtype and same_layout(got, want)
    assert torch.equal(got, want), int((got != want).sum())


@pytest.mark.parametrize("shape,layout", [((2, 11200, 32, 32), "channels_last_chunk"),
                                          ((1, 4608, 2 * 12288), "last_dim_chunk"),
                                          ((2, 4096, 2 * 5120), "last_dim_chunk")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_silu_mul_real_shapes(shape, layout, dtype):
    t = randn(*shape, dtype=dtype, scale=4.0)
    if layout == "channels_last_chunk":
        t = t.to(memory_format=torch.channels_last)
        hidden, gate = t.chunk(2, dim=1)
        want = hidden * F.silu(gate)  # Sana GLUMBConv
        args = (gate, hidden)
    else:
        a, b = t.chunk(2, dim=-1)
        want = F.silu(a) * b
        args = (a, b)
    assert tsilu.can_use(*args)
    got = tsilu.silu_mul(*args)
    assert torch.equal(got, want) and same_layout(got, want)


def test_silu_mul_extremes():
    a = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 88.0, -88.0, 100.0, -100.0, float("inf"), -float("inf"),
                      float("nan"), 1e-30, -87.5, 87.5], device="cuda")
    b = torch.ones_like(a)
    for dtype in (torch.float32, torch.bfloat16):
        got, want = tsilu.silu_mul(a.to(dtype), b.to(dtype)), F.silu(a.to(dtype)) * b.to(dtype)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 3), S=st.integers(1, 300), H=st.integers(1, 6), D=st.sampled_from([16, 32, 64, 80, 96, 128, 256]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       layout=st.sampled_from(["contiguous", "heads_first", "qkv_chunk", "offset"]),
       interleaved=st.booleans())
def test_rope_any_layout(B, S, H, D, dtype, layout, interleaved):
    if layout == "qkv_chunk":
        x = randn(B, S, 3 * H * D, dtype=dtype).chunk(3, dim=-1)[1].unflatten(-1, (H, D))
    elif layout == "offset":
        x = randn(B * S * H * D + 1, dtype=dtype)[1:].view(B, S, H, D)
    else:
        x = randn(B, S, H, D, dtype=dtype)
    cos, sin = randn(S, D, dtype=torch.float32), randn(S, D, dtype=torch.float32)
    c, s = cos[None, :, None], sin[None, :, None]
    if layout == "heads_first":
        x, c, s = x.transpose(1, 2), cos[None, None], sin[None, None]
    from sgdiff.kernels.rope import rope_reference

    want = rope_reference(x, c, s, interleaved)
    got = op["rope"](x, c, s, interleaved)
    assert torch.equal(got, want) and same_layout(got, want)


@settings(max_examples=EXAMPLES, deadline=None)
@given(rows=st.integers(1, 400), H=st.integers(1, 4), D=st.sampled_from([32, 48, 64, 96, 128, 160, 256, 1000, 3072]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       weight=st.sampled_from([None, torch.bfloat16, torch.float32]),
       layout=st.sampled_from(["contiguous", "transposed", "chunk", "offset"]),
       eps=st.sampled_from([1e-6, 1e-5]))
def test_rms_norm_any_layout(rows, H, D, dtype, weight, layout, eps):
    from sgdiff.kernels.rms_norm import rms_norm_reference

    if layout == "chunk":
        x = randn(rows, 2 * H * D, dtype=dtype, scale=2.0).chunk(2, dim=-1)[1].unflatten(-1, (H, D))
    elif layout == "offset":
        x = randn(rows * H * D + 3, dtype=dtype)[3:].view(rows, H, D)
    else:
        x = randn(rows, H, D, dtype=dtype, scale=2.0)
        if layout == "transposed":
            x = x.transpose(0, 1)
    w = None if weight is None else randn(D, dtype=weight)
    want = rms_norm_reference(x, w, eps, "diffusers")
    got = op["rms_norm"](x, w, eps, "diffusers")
    assert got.dtype == want.dtype and same_layout(got, want)
    assert torch.equal(got, want)


# Wan 2.1 1.3B / 14B QK norm across heads (torch.nn.RMSNorm), per-head norms, fp32, eps=None
@pytest.mark.parametrize("shape", [(1, 32760, 1536), (1, 32760, 5120), (2, 4096, 3072), (1, 4608, 24, 128),
                                   (3, 77, 520), (2, 100, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine,eps", [(True, 1e-6), (False, None)])
def test_rms_norm_fused_real_shapes(shape, dtype, affine, eps):
    norm = torch.nn.RMSNorm(shape[-1], eps=eps, elementwise_affine=affine).to("cuda", dtype)
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(shape[-1], device="cuda"))
    x = randn(*shape, dtype=dtype, scale=2.0)
    with torch.no_grad():
        want = norm(x)
    args = (x, norm.weight.detach() if affine else None, eps, "fused")
    assert trms.can_use(*args)
    got = trms.rms_norm(*args)
    assert same_layout(got, want)
    assert torch.equal(got, want), int((got != want).sum())


@settings(max_examples=EXAMPLES, deadline=None)
@given(rows=st.integers(1, 300), D=st.sampled_from([64, 128, 130, 512, 1000, 1536, 2052, 5120]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), affine=st.booleans(),
       layout=st.sampled_from(["contiguous", "chunk", "offset"]), eps=st.sampled_from([None, 1e-6, 1e-5]))
def test_rms_norm_fused_any_layout(rows, D, dtype, affine, layout, eps):
    from sgdiff.kernels.rms_norm import rms_norm_reference

    if layout == "chunk":  # a strided view: eager copies it, aligned
        x = randn(rows, 3 * D, dtype=dtype, scale=2.0).chunk(3, dim=-1)[1]
    elif layout == "offset":  # misaligned storage: eager's Welford fallback, the chain here
        x = randn(rows * D + 1, dtype=dtype)[1:].view(rows, D)
    else:
        x = randn(rows, D, dtype=dtype, scale=2.0)
    w = randn(D, dtype=dtype) if affine else None
    want = torch.nn.functional.rms_norm(x, (D,), w, eps)
    assert torch.equal(want, rms_norm_reference(x, w, eps, "fused").contiguous())
    got = op["rms_norm"](x, w, eps, "fused")
    assert torch.equal(got, want)


def _bits_equal(got, want):
    same = got.view(torch.int16 if got.element_size() == 2 else torch.int32) == \
        want.view(torch.int16 if want.element_size() == 2 else torch.int32)
    return bool((same | (got.isnan() & want.isnan())).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_tanh_cat_every_half_value(dtype):
    x = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype).view(256, 256)
    head = randn(256, 40, dtype=dtype)
    want = torch.cat([head, F.gelu(x, approximate="tanh")], dim=-1)
    assert tgelu.can_use(head, x)
    got = tgelu.gelu_tanh_cat(head, x)
    assert got.shape == want.shape and _bits_equal(got, want)
    assert torch.equal(op["gelu_tanh_cat"](head, x).view(torch.int16), want.view(torch.int16))  # through dispatch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gelu_tanh_cat_flux_single_block(dtype):
    attn = randn(1, 24, 4608, 128, dtype=dtype).transpose(1, 2).flatten(2, 3)  # SDPA output, heads last
    x = randn(1, 4608, 12288, dtype=dtype, scale=3.0)
    want = torch.cat([attn, F.gelu(x, approximate="tanh")], dim=2)
    assert tgelu.can_use(attn, x)
    assert torch.equal(tgelu.gelu_tanh_cat(attn, x), want)


@settings(max_examples=EXAMPLES, deadline=None)
@given(rows=st.integers(1, 300), dh=st.integers(1, 1100), dx=st.integers(1, 2100),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       layout=st.sampled_from(["contiguous", "head_transposed", "x_chunk", "offset"]))
def test_gelu_tanh_cat_any_layout(rows, dh, dx, dtype, layout):
    head, x = randn(rows, dh, dtype=dtype), randn(rows, dx, dtype=dtype, scale=4.0)
    if layout == "head_transposed":
        head = randn(dh, rows, dtype=dtype).t()
    elif layout == "x_chunk":
        x = randn(rows, 2 * dx, dtype=dtype, scale=4.0)[:, dx:]
    elif layout == "offset":
        x = randn(rows * dx + 1, dtype=dtype, scale=4.0)[1:].view(rows, dx)
    want = torch.cat([head, F.gelu(x, approximate="tanh")], dim=-1)
    assert torch.equal(op["gelu_tanh_cat"](head, x), want)


# Flux.1-dev single blocks (image + text tokens), Qwen-Image-sized
@pytest.mark.parametrize("shape", [(1, 4608, 24, 128), (2, 4096, 24, 128), (1, 333, 3, 128)])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine,eps", [(True, 1e-6), (False, None)])
def test_rms_norm_rope_real_shapes(shape, interleaved, dtype, affine, eps):
    from diffusers.models.embeddings import apply_rotary_emb

    B, S, H, D = shape
    x = randn(B, S, H * D, dtype=dtype, scale=2.0).unflatten(-1, (H, D))
    w = randn(D, dtype=dtype) if affine else None
    cos, sin = randn(S, D, dtype=torch.float32), randn(S, D, dtype=torch.float32)
    want = apply_rotary_emb(F.rms_norm(x, (D,), w, eps), (cos, sin), use_real_unbind_dim=-1 if interleaved else -2,
                            sequence_dim=1)
    args = (x, w, eps, "fused", cos[None, :, None], sin[None, :, None], interleaved)
    assert trr.can_use(*args)
    got = trr.rms_norm_rope(*args)
    assert torch.equal(got, want) and same_layout(got, want)


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 2), S=st.integers(1, 300), H=st.integers(1, 5), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       layout=st.sampled_from(["contiguous", "heads_first", "qkv_chunk", "offset"]), interleaved=st.booleans(),
       affine=st.booleans())
def test_rms_norm_rope_any_layout(B, S, H, dtype, layout, interleaved, affine):
    D = 128
    if layout == "qkv_chunk":
        x = randn(B, S, 3 * H * D, dtype=dtype)[..., H * D:2 * H * D].unflatten(-1, (H, D))
    elif layout == "offset":
        x = randn(B * S * H * D + 4, dtype=dtype)[4:].view(B, S, H, D)
    else:
        x = randn(B, S, H, D, dtype=dtype)
    cos, sin = randn(S, D, dtype=torch.float32)[None, :, None], randn(S, D, dtype=torch.float32)[None, :, None]
    if layout == "heads_first":
        x, cos, sin = x.transpose(1, 2), cos.transpose(1, 2), sin.transpose(1, 2)
    w = randn(D, dtype=dtype) if affine else None
    from sgdiff.kernels.rms_norm_rope import rms_norm_rope_reference  # the eager chain

    want = rms_norm_rope_reference(x, w, 1e-6, "fused", cos, sin, interleaved)
    got = op["rms_norm_rope"](x, w, 1e-6, "fused", cos, sin, interleaved)
    assert torch.equal(got, want) and same_layout(got, want)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine,eps", [(True, 1e-6), (False, None)])
def test_rms_norm_cat_rope_flux_double_block(interleaved, dtype, affine, eps):
    from diffusers.models.embeddings import apply_rotary_emb

    H, D = 24, 128
    txt = randn(1, 512, H * D, dtype=dtype, scale=2.0).unflatten(-1, (H, D))
    img = randn(1, 4096, H * D, dtype=dtype, scale=2.0).unflatten(-1, (H, D))
    wt, wi = (randn(D, dtype=dtype), randn(D, dtype=dtype)) if affine else (None, None)
    cos, sin = randn(4608, D, dtype=torch.float32), randn(4608, D, dtype=torch.float32)
    joined = torch.cat([F.rms_norm(txt, (D,), wt, eps), F.rms_norm(img, (D,), wi, eps)], dim=1)
    want = apply_rotary_emb(joined, (cos, sin), use_real_unbind_dim=-1 if interleaved else -2, sequence_dim=1)
    args = (txt, wt, img, wi, eps, "fused", cos[None, :, None], sin[None, :, None], interleaved)
    assert trr.can_use_cat(*args)
    got = trr.rms_norm_cat_rope(*args)
    assert torch.equal(got, want) and same_layout(got, want)
    assert torch.equal(op["rms_norm_cat_rope"](*args), want)  # through dispatch: verified, not disabled


def test_rope_complex_contraction():
    """Which FMA contraction of the complex product nvcc gave ATen's complex multiply: the
    kernel's COMPLEX_FMA must be one of the variants that are bitwise eager's."""
    from sgdiff.kernels.rope_complex import rope_complex_reference

    x = randn(2, 1024, 24, 128, dtype=torch.float32, scale=3.0)
    freqs = torch.polar(torch.rand(1024, 64, device="cuda") + 0.5, torch.randn(1024, 64, device="cuda") * 3)[:, None]
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        want = rope_complex_reference(xd, freqs)
        exact = [v for v in range(9) if torch.equal(trope.rope_complex(xd, freqs, complex_fma=v), want)]
        print(dtype, "variants equal to eager:", exact)
        assert trope.COMPLEX_FMA in exact, exact


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_complex_qwen_image(dtype):
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    x = randn(1, 4096, 24, 128, dtype=dtype, scale=3.0)
    freqs = torch.polar(torch.ones(4096, 64, device="cuda"), torch.randn(4096, 64, device="cuda") * 10)
    want = apply_rotary_emb_qwen(x, freqs, use_real=False)
    assert trope.can_use_complex(x, freqs[:, None])
    assert torch.equal(op_complex()(x, freqs[:, None]), want)


def op_complex():
    return registry.op_def("rope_complex").load()


def glumbconv_eager(x, w1, b1, w2, b2, groups):
    """Sana's GLUMBConv up to its last convolution, as eager runs it."""
    h = F.silu(F.conv2d(x, w1, b1))
    a, gate = F.conv2d(h, w2, b2, padding=w2.shape[-1] // 2, groups=groups).chunk(2, dim=1)
    return h, a * F.silu(gate)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_conv_epilogues_sana_glumbconv(dtype):
    # Sana 1.6B at 1024px, batch 2: 2240 -> 11200 channels (1x1), then 3x3 depthwise, channels-last
    C, hidden = 2240, 11200
    x = randn(2, 1024, C, dtype=dtype).unflatten(1, (32, 32)).permute(0, 3, 1, 2)
    w1, b1 = randn(hidden, C, 1, 1, dtype=dtype, scale=C ** -0.5), randn(hidden, dtype=dtype)
    w2, b2 = randn(hidden, 1, 3, 3, dtype=dtype, scale=1 / 3), randn(hidden, dtype=dtype)
    h, want = glumbconv_eager(x, w1, b1, w2, b2, hidden)
    inverted, depth = (x, w1, b1, [1, 1], [0, 0], [1, 1], 1), (h, w2, b2, [1, 1], [1, 1], [1, 1], hidden)
    assert tconv.can_use(*inverted) and tconv.can_use(*depth, halves=True)
    got_h, got = tconv.conv_silu(*inverted), tconv.conv_silu_mul(*depth)
    assert torch.equal(got_h, h) and same_layout(got_h, h)
    assert torch.equal(got, want) and same_layout(got, want)
    # through dispatch: verified on first sight, and not disabled (the fixture checks)
    assert torch.equal(op["conv_silu"](*inverted), h) and torch.equal(op["conv_silu_mul"](*depth), want)


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 2), C=st.sampled_from([8, 24, 64]), ratio=st.sampled_from([1, 2, 5]), H=st.integers(1, 12),
       W=st.integers(1, 12), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       channels_last=st.booleans(), depthwise=st.booleans())
def test_conv_epilogues_any_shape(B, C, ratio, H, W, dtype, channels_last, depthwise):
    """Every shape is bitwise eager's: through the kernel where ATen convolves on cuDNN, through
    the chain elsewhere (a contiguous depthwise convolution runs ATen's own kernel, bias inside)."""
    hidden = 2 * C * ratio
    x = randn(B, C, H, W, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w1, b1 = randn(hidden, C, 1, 1, dtype=dtype, scale=C ** -0.5), randn(hidden, dtype=dtype)
    groups = hidden if depthwise else 1
    w2, b2 = randn(hidden, hidden // groups, 3, 3, dtype=dtype, scale=0.3), randn(hidden, dtype=dtype)
    h, want = glumbconv_eager(x, w1, b1, w2, b2, groups)
    got_h = op["conv_silu"](x, w1, b1, [1, 1], [0, 0], [1, 1], 1)
    got = op["conv_silu_mul"](h, w2, b2, [1, 1], [1, 1], [1, 1], groups)
    assert torch.equal(got_h, h) and same_layout(got_h, h)
    assert torch.equal(got, want) and same_layout(got, want)


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def sana_operands(B, N, H, D, dtype):
    """q, k, v as SanaLinearAttnProcessor2_0 views its projections, with NaN and -0.0 inside."""
    proj = randn(3, B, N, H * D, dtype=dtype, scale=2.0)
    proj[:, 0, 0, :3] = torch.tensor([float("nan"), -0.0, 0.0], dtype=dtype)
    q, k, v = (p.transpose(1, 2).unflatten(1, (H, -1)) for p in proj)
    return q, k.transpose(2, 3), v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B", [1, 2])
def test_cast_copy_sana_linear_attention(dtype, B):
    # Sana 1.6B at 1024px: 1024 tokens, 70 heads of 32
    q, k, v = sana_operands(B, 1024, 70, 32, dtype)
    cases = [((q, torch.float32, True, [], 0.0, True), torch.relu(q).float().contiguous()),
             ((k, torch.float32, True, [], 0.0, True), torch.relu(k).float().contiguous()),
             ((q, torch.float32, True, [], 0.0, False), torch.relu(q).float()),
             ((v, torch.float32, False, [0, 0, 0, 1], 1.0, True), F.pad(v.float(), (0, 0, 0, 1), value=1.0))]
    for args, want in cases:
        assert tcast.can_use(*args)
        got = tcast.cast_copy(*args)
        # bit for bit: ReLU keeps NaN and the sign of zero as ATen's clamp_min does
        assert torch.equal(bits(got), bits(want)) and same_layout(got, want)
        assert torch.equal(bits(op["cast_copy"](*args)), bits(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.float32, "same"])
def test_cast_copy_relu_every_16bit_value(dtype, out_dtype):
    """Every bf16/fp16 bit pattern (NaNs with their payloads, both zeros, subnormals) through the
    ReLU and the cast, read through Sana's transposed view: the kernel takes no rounding step
    back to x's dtype, so each output must come out exactly as eager's."""
    out_dtype = dtype if out_dtype == "same" else out_dtype
    every = every_16bit_value(dtype)
    x = every.view(1, 1024, 2 * 32).transpose(1, 2).unflatten(1, (2, 32))  # [B, heads, head_dim, tokens]
    for contiguous in (True, False):
        args = (x, out_dtype, True, [], 0.0, contiguous)
        want = torch.relu(x).to(out_dtype)
        want = want.contiguous() if contiguous else want
        got = tcast.cast_copy(*args)
        assert torch.equal(bits(got), bits(want)) and same_layout(got, want), contiguous


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 3), N=st.integers(1, 300), H=st.integers(1, 6), D=st.sampled_from([8, 32, 64]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), which=st.sampled_from(["q", "k", "v"]),
       contiguous=st.booleans())
def test_cast_copy_any_shape(B, N, H, D, dtype, which, contiguous):
    q, k, v = sana_operands(B, N, H, D, dtype)
    x = {"q": q, "k": k, "v": v}[which]
    if which == "v":
        args, want = (x, torch.float32, False, [0, 0, 0, 1], 1.0, True), F.pad(x.float(), (0, 0, 0, 1), value=1.0)
    else:
        args = (x, torch.float32, True, [], 0.0, contiguous)
        want = torch.relu(x).float().contiguous() if contiguous else torch.relu(x).float()
    got = op["cast_copy"](*args)
    assert torch.equal(bits(got), bits(want)) and same_layout(got, want)


def processor_output(h, dtype):
    """SanaLinearAttnProcessor2_0 after its second matmul."""
    y = h[:, :, :-1] / (h[:, :, -1:] + 1e-15)
    return y.flatten(1, 2).transpose(1, 2).to(dtype)


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 70), D=st.sampled_from([8, 32, 64]), N=st.integers(3, 1100),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_linear_attention_out_any_shape(B, H, D, N, dtype):
    h = randn(B, H, D + 1, N, dtype=torch.float32, scale=50.0)
    h[0, 0, -1, :3] = torch.tensor([-1e-15, 0.0, float("inf")])  # a zero normalizer, 0/0, x/inf
    h[0, 0, 0, 1] = 0.0
    want = processor_output(h, dtype)
    assert tlao.can_use(h, 1e-15, dtype)
    got = op["linear_attention_out"](h, 1e-15, dtype)
    assert torch.equal(bits(got), bits(want)) and got.stride() == want.stride()


def scale_and_shift(form, B, S, D, dtype):
    """A modulation's scale and shift as models write them: ``chunk``s of an embedding projection,
    ``table`` rows, a table + temb sum ``unbound`` into its rows (LTX-Video), ``per_token``
    projections, or an ``fp32_scale`` over a half stream."""
    if form == "chunk":
        shift, scale = (t[:, None] for t in randn(B, 6 * D, dtype=dtype).chunk(6, dim=1)[:2])
    elif form == "table":
        shift, scale = randn(B, 6, D, dtype=dtype).chunk(6, dim=1)[:2]
    elif form == "unbound":
        shift, scale = (randn(6, D, dtype=dtype)[None, None] + randn(B, 1, 6 * D, dtype=dtype).reshape(B, 1, 6, -1)).unbind(2)[:2]
    elif form == "per_token":
        scale, shift = randn(B, S, 2 * D, dtype=dtype).chunk(2, dim=-1)
    else:
        scale, shift = randn(B, 1, D, dtype=torch.float32), randn(B, 1, D, dtype=dtype)
    return scale, shift


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 2), S=st.integers(1, 300), D=st.sampled_from([64, 1152, 2240, 3072, 5120]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       form=st.sampled_from(["chunk", "table", "per_token", "fp32_scale", "no_shift"]))
def test_modulate_any_form(B, S, D, dtype, form):
    """x * (1 + scale) + shift as models write it: chunks of an embedding projection, table rows,
    per-token projections, an fp32 scale over a bf16 stream, and scale-only."""
    x = randn(B, S, D, dtype=dtype, scale=3.0)
    scale, shift = scale_and_shift("chunk" if form == "no_shift" else form, B, S, D, dtype)
    if form == "no_shift":
        shift = None
    want = x * (1 + scale) if shift is None else x * (1 + scale) + shift
    got = op["modulate"](x, scale, shift)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype


@settings(max_examples=EXAMPLES, deadline=None)
@given(B=st.integers(1, 2), S=st.integers(1, 300), D=st.sampled_from([64, 128, 2048, 2304, 3072]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), form=st.sampled_from(["fused", "diffusers"]),
       weight=st.sampled_from([None, "same", "fp32"]), params=st.sampled_from(["chunk", "unbound", "per_token", "fp32_scale"]),
       shift=st.booleans())
def test_rmsnorm_modulate_any_form(B, S, D, dtype, form, weight, params, shift):
    """The norm and its modulation in one pass, as models write them: chunks of an embedding
    projection (Lumina), table + temb rows unbound from one tensor (LTX-Video), per-token
    projections, an fp32 scale over a half stream; a weight of x's dtype or (diffusers' form) fp32,
    whose norm output is then fp32; scale-only."""
    from sgdiff.kernels.rmsnorm_modulate import rmsnorm_modulate_reference

    x = randn(B, S, D, dtype=dtype, scale=3.0)
    if weight == "fp32" and form == "fused":
        weight = "same"  # the fused form takes a weight of x's dtype only
    w = None if weight is None else randn(D, dtype=dtype if weight == "same" else torch.float32)
    sc, sh = scale_and_shift(params, B, S, D, dtype)
    args = (x, w, 1e-6, form, sc, sh if shift else None)
    want = rmsnorm_modulate_reference(*args)
    got = op["rmsnorm_modulate"](*args)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
    # the kernel itself wherever it applies (every fused-form input here; the diffusers form
    # leaves few rows to the chain, as ATen's mean then widens its block)
    assert trmod.can_use(*args) or form == "diffusers"
    if trmod.can_use(*args):
        assert torch.equal(trmod.rmsnorm_modulate(*args), want)
