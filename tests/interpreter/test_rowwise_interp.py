"""The row-wise Triton kernels under Triton's CPU interpreter, against their references: rms_norm
(fused and diffusers forms), rope (interleaved and halves, complex, even/odd), silu_mul and a
convolution's epilogues, cast_copy, linear_attention_out, modulate, rmsnorm_modulate,
rms_norm_rope, rms_norm_cat_rope and gelu_tanh_cat.

The interpreter computes fp32 like the GPU (fma, correctly rounded division), so fp32 results are
exact where the reference does the kernel's arithmetic in the kernel's order; it truncates
fp32 -> bf16 (an ulp or two per rounding) and its exp and tanh are numpy's, not CUDA's, so those
are compared with a tolerance and exactness is claimed only on the GPU (tests/gpu). Run by
tests/test_triton_interpreter.py with TRITON_INTERPRET=1 (skipped without it).
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from sgdiff.kernels.cast_copy import cast_copy_reference  # noqa: E402
from sgdiff.kernels.gelu_tanh_cat import gelu_tanh_cat_reference  # noqa: E402
from sgdiff.kernels.linear_attention_out import linear_attention_out_reference  # noqa: E402
from sgdiff.kernels.modulate import modulate_reference  # noqa: E402
from sgdiff.kernels.rms_norm import rms_norm_reference  # noqa: E402
from sgdiff.kernels.rmsnorm_modulate import rmsnorm_modulate_reference  # noqa: E402
from sgdiff.kernels.rope import rope_reference  # noqa: E402
from sgdiff.kernels.rope_complex import rope_complex_reference  # noqa: E402
from sgdiff.kernels.rope_even_odd import rope_even_odd_reference  # noqa: E402
from sgdiff.kernels.rope_matrix import rope_matrix_reference  # noqa: E402
from sgdiff.kernels.silu_mul import silu_mul_reference  # noqa: E402
from sgdiff.kernels.triton import cast_copy as tcast, gelu_tanh_cat as tgelu, linear_attention_out as tlao  # noqa: E402
from sgdiff.kernels.triton import modulate as tmod, rms_norm as trms, rms_norm_rope as trr  # noqa: E402
from sgdiff.kernels.triton import rmsnorm_modulate as trmod, rope as trope, silu_mul as tsilu  # noqa: E402
from tests.interpreter.common import FP32_BF16, check, drawn, ids  # noqa: E402

pytestmark = pytest.mark.interpreter

DTYPES = pytest.mark.parametrize("dt", FP32_BF16, ids=ids)


def sqrt32(v):
    # correctly rounded fp32 sqrt, as the interpreter's (torch's CPU sqrt can be an ulp off);
    # through fp64, whose double rounding is exact for sqrt
    return torch.sqrt(v.double()).float()


def cuda_order_rms(x, w, eps):
    # ATen's CUDA reduction order for mean(-1) of the squares, written with elementwise
    # fp32 adds only (see sgdiff/kernels/triton/rms_norm.py), then diffusers' RMSNorm
    xf = x.float()
    sq = (xf * xf).reshape(-1, x.shape[-1])
    M, N = sq.shape
    if N >= 128:
        K = -(-N // 128)
        v = F.pad(sq, (0, K * 128 - N)).view(M, K, 32, 4)
        acc = v[:, 0]
        for k in range(1, K):
            acc = acc + v[:, k]
    else:
        acc = F.pad(sq, (0, 128 - N)).view(M, 4, 32).transpose(1, 2)
    lanes = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    for off in (16, 8, 4, 2, 1):
        lanes = torch.cat([lanes[:, :off] + lanes[:, off:2 * off], lanes[:, 2 * off:]], 1)
    mean = lanes[:, 0] * trms.mean_factor(M, N)
    r = 1.0 / sqrt32(mean + torch.tensor(eps, dtype=torch.float32))
    y = (xf.reshape(M, N) * r[:, None]).view(x.shape)
    if w is None:
        return y.to(x.dtype)
    return (y.to(w.dtype) if w.dtype != torch.float32 else y) * w


def cuda_order_fused(x, w, eps):
    # ATen's vectorized RMSNorm (128 threads, fma per thread, warp trees, (w0+w2)+(w1+w3));
    # x holds bf16 values, so x * x is exact and fma(x, x, acc) == acc + x * x
    xf = x.float().reshape(-1, x.shape[-1])
    M, N = xf.shape
    K = -(-N // 512)
    v = F.pad(xf, (0, K * 512 - N)).view(M, K, 128, 4)
    acc = torch.zeros(M, 128)
    for k in range(K):
        for j in range(4):
            acc = acc + v[:, k, :, j] * v[:, k, :, j]
    warps = acc.view(M, 4, 32)
    for off in (16, 8, 4, 2, 1):
        warps = torch.cat([warps[..., :off] + warps[..., off:2 * off], warps[..., 2 * off:]], -1)
    s = warps[..., 0]
    total = (s[:, 0] + s[:, 2]) + (s[:, 1] + s[:, 3])
    r = 1.0 / sqrt32(total / N + torch.tensor(eps, dtype=torch.float32))
    y = r[:, None] * xf
    if w is not None:
        y = w.float() * y
    return y.to(x.dtype).view(x.shape)


FUSED_SHAPES = [(3, 5120), (2, 3, 128), (4, 3072), (2, 2, 520)]
ROPE_CASES = list(itertools.product((16, 40, 6), (True, False)))   # (head dim, interleaved)
DIFFUSERS_SHAPES = [(2, 7, 3, 128), (40, 64), (16, 3, 48), (3, 11, 256), (20, 1000), (17, 3072)]
CAST_COPY_FORMS = ["relu", "relu_transposed", "relu_not_contiguous", "padded"]
TOKENS = (37, 64)
MODULATE_FORMS = ["table_rows", "fp32_scale", "per_token_shift"]
RMSNORM_MODULATE_NORMS = ["diffusers", "diffusers_fp32_weight", "fused", "fused_weight"]
RMSNORM_MODULATE_MODULATIONS = ["table_rows", "per_token", "fp32_scale", "scale_only"]
GELU_TANH_CAT_FORMS = ["flux_attention", "odd_width", "one_row", "head_only_blocks"]


def script_draws():
    """The former script's random inputs in its order (see tests.interpreter.common.drawn), for
    fp32 then bf16."""
    torch.manual_seed(0)
    for dt in FP32_BF16:
        for shape in FUSED_SHAPES:
            x = (torch.randn(*shape) * 2).to(torch.bfloat16).to(dt)   # bf16 values: x * x exact
            yield ("rms_norm_fused", dt, shape), (x, torch.randn(shape[-1]).to(torch.bfloat16).to(dt))
        for D, inter in ROPE_CASES:
            x = torch.randn(2, 37, 3, D, dtype=dt)
            yield ("rope", dt, D, inter), (x, torch.randn(37, D), torch.randn(37, D))
        x = torch.randn(2, 37, 3, 16, dtype=dt)
        cos, sin = torch.randn(37, 16), torch.randn(37, 16)
        freqs = torch.polar(torch.rand(37, 8) + 0.5, torch.randn(37, 8))[:, None]     # [S, 1, D/2], as Qwen's unsqueeze(1)
        yield ("rope_16", dt), (x, cos, sin, freqs)
        for shape in DIFFUSERS_SHAPES:
            x = torch.randn(*shape, dtype=dt) * 2
            n = shape[-1]
            yield ("rms_norm_diffusers", dt, shape), (x, {None: None, torch.bfloat16: torch.randn(n, dtype=torch.bfloat16),
                                                          torch.float32: torch.randn(n)})
        yield ("rms_norm_heads_first", dt), torch.randn(2, 40, 3, 64, dtype=dt).transpose(1, 2)
        a, b = (torch.randn(2, 7, 2 * 300, dtype=dt) * 4).chunk(2, -1)
        yield ("silu_mul", dt), (a, b, torch.randn(2, 8, 5, 6, dtype=dt).to(memory_format=torch.channels_last))
        # a biased convolution's output and its bias
        y, bias = torch.randn(2, 8, 5, 6, dtype=dt).to(memory_format=torch.channels_last), torch.randn(8, dtype=dt) * 4
        yield ("conv_epilogue", dt), (y, bias)
        proj = torch.randn(2, 37, 3 * 8, dtype=dt)
        proj[0, 0, :2] = float("nan")
        q = proj.transpose(1, 2).unflatten(1, (3, -1))                  # [B, H, D, N], D contiguous
        yield ("cast_copy", dt), dict(zip(CAST_COPY_FORMS, [   # (x, relu, pad, contiguous)
            (q, True, [], True), (q.transpose(2, 3), True, [], True), (q, True, [], False), (q, False, [0, 0, 0, 1], True)]))
        for tokens in TOKENS:
            yield ("linear_attention_out", dt, tokens), torch.randn(2, 3, 9, tokens) * 3
        xm = torch.randn(2, 7, 40, dtype=dt)
        emb = torch.randn(2, 6 * 40, dtype=dt).chunk(6, dim=1)
        yield ("modulate", dt), (xm, dict(zip(MODULATE_FORMS, [   # (scale, shift)
            (emb[1][:, None], emb[0][:, None]), (torch.randn(2, 1, 40), None),
            (torch.randn(40, dtype=dt), torch.randn(2, 7, 40))])))
        xr, (shift, scale) = torch.randn(2, 7, 128, dtype=dt), torch.randn(2, 1, 2 * 128, dtype=dt).chunk(2, -1)
        yield ("rmsnorm_modulate_chain", dt), (xr, scale, shift, torch.randn(128, dtype=dt))
        xr = torch.randn(2, 40, 448, dtype=dt) * 3  # 80 rows: ATen's mean then takes a warp a row
        tok_scale, tok_shift = torch.randn(2, 40, 2 * 448, dtype=dt).chunk(2, -1)
        table = torch.randn(2, 6, 448, dtype=dt).chunk(6, dim=1)
        norms = dict(zip(RMSNORM_MODULATE_NORMS, [   # (weight, eps, form)
            (torch.randn(448, dtype=dt), 1e-6, "diffusers"), (torch.randn(448), 1e-6, "diffusers"),
            (None, None, "fused"), (torch.randn(448, dtype=dt), 1e-5, "fused")]))
        modulations = {norm: dict(zip(RMSNORM_MODULATE_MODULATIONS, [   # (scale, shift), drawn for each norm
            (table[1], table[0]), (tok_scale, tok_shift), (torch.randn(2, 1, 448), table[0]), (table[1], None)]))
            for norm in norms}
        yield ("rmsnorm_modulate", dt), (xr, norms, modulations)
        x = (torch.randn(2, 37, 3, 128) * 2).to(dt)
        cos, sin = torch.randn(37, 128), torch.randn(37, 128)
        weights = {heads_first: torch.randn(128).to(dt) for heads_first in (False, True)}   # drawn for each layout
        yield ("rms_norm_rope", dt), (x, cos, sin, weights)
        # text and image rows
        xt, xi = (torch.randn(2, 7, 3, 128) * 2).to(dt), (torch.randn(2, 30, 384) * 2).to(dt).unflatten(-1, (3, 128))
        yield ("rms_norm_cat_rope", dt), (xt, xi, cos, sin, torch.randn(128).to(dt), torch.randn(128).to(dt))
        yield ("rms_norm_rope_refused", dt), (x, xt, xi, cos, sin, torch.randn(2, 3, 64))
        attn = torch.randn(2, 3, 9, 16, dtype=dt).transpose(1, 2).flatten(2, 3)
        yield ("gelu_tanh_cat", dt), dict(zip(GELU_TANH_CAT_FORMS, [   # (head, x)
            (attn, torch.randn(2, 9, 200, dtype=dt) * 3), (torch.randn(5, 7, dtype=dt), torch.randn(5, 1100, dtype=dt)),
            (torch.randn(3, dtype=dt), torch.randn(6, dtype=dt)), (torch.randn(4, 300, dtype=dt), torch.randn(4, 40, dtype=dt))]))


def inputs(*case):
    return drawn(script_draws(), case)


# rms_norm (fused form, F.rms_norm on CUDA)
@pytest.mark.parametrize("weight", [False, True], ids=["no_weight", "weight"])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=ids)
@DTYPES
def test_rms_norm_fused(dt, shape, weight):
    x, w = inputs("rms_norm_fused", dt, shape)
    w, eps = (w, 1e-6) if weight else (None, None)
    assert trms.supported_layout(x, w, eps, "fused"), shape
    got = trms.rms_norm(x, w, eps, "fused")
    check(got, cuda_order_fused(x, w, 2.0 ** -23 if eps is None else eps), dt == torch.float32)


# rope: Flux-like [B, S, H, D] and heads-first views, both rotations
# (head dims that fill a tile, leave its end idle, or give odd halves)
@pytest.mark.parametrize("heads_first", [False, True], ids=["tokens_first", "heads_first"])
@pytest.mark.parametrize("D,interleaved", ROPE_CASES, ids=[f"{D}-{'interleaved' if i else 'halves'}" for D, i in ROPE_CASES])
@DTYPES
def test_rope(dt, D, interleaved, heads_first):
    x, cos, sin = inputs("rope", dt, D, interleaved)
    if heads_first:
        args = (x.transpose(1, 2), cos[None, None], sin[None, None], interleaved)
    else:
        args = (x, cos[None, :, None], sin[None, :, None], interleaved)
        assert trope.supported_layout(*args)
    check(trope.rope(*args), rope_reference(*args), dt == torch.float32)


# rope_complex (Qwen-Image): without contraction the product is plain fp32 arithmetic, so
# it is exact against the same arithmetic in torch; the default contraction within a tolerance
@DTYPES
def test_rope_complex_without_contraction(dt):
    x, _, _, freqs = inputs("rope_16", dt)
    assert trope.supported_layout_complex(x, freqs)
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, d = freqs.real, freqs.imag
    plain = torch.stack([a * c - b * d, a * d + b * c], -1).flatten(-2).to(dt)
    check(trope.rope_complex(x, freqs, complex_fma=0), plain, dt == torch.float32)


@DTYPES
def test_rope_complex128_without_contraction(dt):
    """AnyFlow's complex128 table: the product in fp64 (exact here without contraction), then to
    fp32, then to x's dtype, as ATen casts from double."""
    x, _, _, freqs = inputs("rope_16", dt)
    freqs = freqs.to(torch.complex128)
    assert trope.supported_layout_complex(x, freqs)
    a, b = x.double().unflatten(-1, (-1, 2)).unbind(-1)
    c, d = freqs.real, freqs.imag
    plain = torch.stack([a * c - b * d, a * d + b * c], -1).flatten(-2).float().to(dt)
    check(trope.rope_complex(x, freqs, complex_fma=0), plain, dt == torch.float32)


@DTYPES
def test_rope_complex(dt):
    x, _, _, freqs = inputs("rope_16", dt)
    assert trope.supported_layout_complex(x, freqs)
    check(trope.rope_complex(x, freqs), rope_complex_reference(x, freqs), False)


@DTYPES
def test_rope_even_odd(dt):
    x, cos, sin, _ = inputs("rope_16", dt)
    args = (x, cos[None, :, None, 0::2], sin[None, :, None, 1::2])
    assert trope.supported_layout_even_odd(*args)
    check(trope.rope_even_odd(*args), rope_even_odd_reference(*args), dt == torch.float32)


# rope_matrix (Kandinsky's sum, PRX's select form): a 2x2 table a pair, tokens or heads first; a zero
# x against the table's negative entries gives -0 products: their sum from +0 is +0 (ATen's sum),
# their plain sum -0 (the select form's add)
@pytest.mark.parametrize("from_zero", [True, False], ids=["sum", "select"])
@pytest.mark.parametrize("heads_first", [False, True], ids=["tokens_first", "heads_first"])
@DTYPES
def test_rope_matrix(dt, heads_first, from_zero):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 37, 3, 16, generator=g).to(dt)
    x[:, :3] = 0
    angle = torch.randn(37, 1, 8, generator=g)
    table = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], -1).view(37, 1, 8, 2, 2)
    if heads_first:
        x, table = x.transpose(1, 2), table[:, 0]  # [B, H, S, D] over [S, D/2, 2, 2]
    args = (x, table, from_zero, None, dt)
    assert trope.supported_layout_matrix(*args)
    got = trope.rope_matrix(*args)
    assert got.stride() == rope_matrix_reference(*args).stride()
    check(got, rope_matrix_reference(*args), dt == torch.float32)
    zeros = got[:, :3] if not heads_first else got[:, :, :3]
    pairs = table.expand(*x.shape[:-1], 8, 2, 2)[..., 0, 1] < 0  # the even output's two products -0
    want_negative = (pairs & (table.expand(*x.shape[:-1], 8, 2, 2)[..., 0, 0] < 0))
    want_negative = (want_negative[:, :3] if not heads_first else want_negative[:, :, :3]) & (not from_zero)
    assert torch.equal(torch.signbit(zeros[..., 0::2]), want_negative)


# rms_norm (diffusers form): the kernel's order is ATen's CUDA order
@pytest.mark.parametrize("against", ["cuda_order", "cpu_eager"])
@pytest.mark.parametrize("weight", [None, torch.bfloat16, torch.float32], ids=["no_weight", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", DIFFUSERS_SHAPES, ids=ids)
@DTYPES
def test_rms_norm_diffusers(dt, shape, weight, against):
    x, weights = inputs("rms_norm_diffusers", dt, shape)
    w = weights[weight]
    assert trms.supported_layout(x, w, 1e-6, "diffusers"), shape
    got = trms.rms_norm(x, w, 1e-6, "diffusers")
    if against == "cuda_order":
        exact = dt == torch.float32 and (w is None or w.dtype == torch.float32)
        check(got, cuda_order_rms(x, w, 1e-6).as_strided(got.shape, got.stride()), exact)
    else:
        check(got, rms_norm_reference(x, w, 1e-6, "diffusers"), False)   # CPU eager: another order


@DTYPES
def test_rms_norm_diffusers_heads_first(dt):
    xt = inputs("rms_norm_heads_first", dt)
    check(trms.rms_norm(xt, None, 1e-6, "diffusers"), rms_norm_reference(xt, None, 1e-6, "diffusers"), False)


# silu_mul: projection halves and channels-last chunks (numpy's exp is not CUDA's: a tolerance)
@DTYPES
def test_silu_mul_projection_halves(dt):
    a, b, _ = inputs("silu_mul", dt)
    check(tsilu.silu_mul(a, b), silu_mul_reference(a, b), False)


@DTYPES
def test_silu_mul_channels_last_chunks(dt):
    _, _, c = inputs("silu_mul", dt)
    hidden, gate = c.chunk(2, 1)
    check(tsilu.silu_mul(gate, hidden), silu_mul_reference(gate, hidden), False)


# rope computed in one dtype (arith_dtype): fp32 left in fp32, or bf16 products and sum
@pytest.mark.parametrize("arith", [torch.float32, torch.bfloat16], ids=ids)
def test_rope_arith_dtype(arith):
    from sgdiff.kernels.rope import rope_reference

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 7, 3, 96, generator=g).to(torch.bfloat16)[..., :64]  # a head's leading rotary dims
    cos, sin = (torch.randn(1, 7, 1, 64, generator=g).to(arith) for _ in range(2))
    for interleaved in (True, False):
        assert trope.supported_layout(x, cos, sin, interleaved, arith)
        check(trope.rope(x, cos, sin, interleaved, arith), rope_reference(x, cos, sin, interleaved, arith),
              arith == torch.float32)


# gelu_mul (a GeGLU): numpy's erf is not CUDA's erff, a tolerance
@DTYPES
def test_gelu_mul_halves(dt):
    from sgdiff.kernels.gelu_mul import gelu_mul_reference

    g = torch.Generator().manual_seed(7)
    b, a = (torch.randn(2, 9, 2 * 200, generator=g) * 3).to(dt).chunk(2, dim=-1)
    check(tsilu.gelu_mul(a, b), gelu_mul_reference(a, b), False)


# a biased convolution's epilogue: the bias (rounded as ATen's add_), then the SiLU or the GLU
@DTYPES
def test_bias_silu_mul_epilogue(dt):
    y, bias = inputs("conv_epilogue", dt)
    hidden, gate = (y + bias.view(-1, 1, 1)).chunk(2, 1)
    check(tsilu.bias_silu_mul_bind(y, bias)(y, bias), silu_mul_reference(gate, hidden), False, tol=2 ** -4)  # 3 roundings


@DTYPES
def test_bias_silu_epilogue(dt):
    y, bias = inputs("conv_epilogue", dt)
    yb = y + bias.view(-1, 1, 1)
    check(tsilu.bias_silu_bind(y, bias)(y, bias), F.silu(yb), False)   # in place, into y


# cast_copy: Sana's linear-attention operands, read through their views (nothing rounds)
@pytest.mark.parametrize("form", CAST_COPY_FORMS)
@DTYPES
def test_cast_copy(dt, form):
    x, relu, pad, contiguous = inputs("cast_copy", dt)[form]
    args = (x, torch.float32, relu, pad, 1.0, contiguous)
    assert tcast.supported_layout(*args)
    got, want = tcast.cast_copy(*args), cast_copy_reference(*args)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()   # NaN passes the ReLU
    check(got.nan_to_num(7.0), want.nan_to_num(7.0), True)


# linear_attention_out: fp32 out is exact (an fp32 sum, an IEEE division); dt with its rounding.
# 37 tokens leave partial tiles, 64 whole ones (no masks)
@pytest.mark.parametrize("out", ["float32", "dt"])
@pytest.mark.parametrize("tokens", TOKENS)
@DTYPES
def test_linear_attention_out(dt, tokens, out):
    h = inputs("linear_attention_out", dt, tokens)
    out_dtype = torch.float32 if out == "float32" else dt
    assert tlao.supported_layout(h, 1e-15, out_dtype)
    check(tlao.linear_attention_out(h, 1e-15, out_dtype),
          linear_attention_out_reference(h, 1e-15, out_dtype), out_dtype == torch.float32)


# modulate: x * (1 + scale) + shift over broadcast table rows and projection chunks
@pytest.mark.parametrize("form", MODULATE_FORMS)
@DTYPES
def test_modulate(dt, form):
    xm, forms = inputs("modulate", dt)
    scale, shift = forms[form]
    assert tmod.supported_layout(xm, scale, shift)
    check(tmod.modulate(xm, scale, shift), modulate_reference(xm, scale, shift), dt == torch.float32)


# rmsnorm_modulate: against the chain (the norm's reduction order is CUDA's: a tolerance), and
# exactly the norm's kernel then the modulate kernel (the interpreter rounds alike in both):
# one pass rounds the norm's output where the two kernels store it, over table rows,
# per-token projections, an fp32 scale over a half stream, scale-only, and an fp32 weight
# (the diffusers norm's output then fp32); rows of 448: 3.5 of the diffusers form's chunks
@pytest.mark.parametrize("form", ["diffusers", "fused"])
@DTYPES
def test_rmsnorm_modulate_against_chain(dt, form):
    xr, scale, shift, w = inputs("rmsnorm_modulate_chain", dt)
    w, eps = (w, 1e-6) if form == "diffusers" else (None, None)
    args = (xr, w, eps, form, scale, shift)
    assert trmod.supported_layout(*args)
    check(trmod.rmsnorm_modulate(*args), rmsnorm_modulate_reference(*args), False, tol=2 ** -4)  # 4 roundings


@pytest.mark.parametrize("modulation", RMSNORM_MODULATE_MODULATIONS)
@pytest.mark.parametrize("norm", RMSNORM_MODULATE_NORMS)
@DTYPES
def test_rmsnorm_modulate_against_kernels(dt, norm, modulation):
    xr, norms, modulations = inputs("rmsnorm_modulate", dt)
    w, eps, form = norms[norm]
    scale, shift = modulations[norm][modulation]
    args = (xr, w, eps, form, scale, shift)
    assert trmod.supported_layout(*args)
    check(trmod.rmsnorm_modulate(*args), tmod.modulate(trms.rms_norm(xr, w, eps, form), scale, shift), True)


# rms_norm_rope: the fused norm then the rotation on one tile, equal to the two kernels
# one after the other (the interpreter rounds alike in both), per-head and heads-first
@pytest.mark.parametrize("weighted", [True, False], ids=["weight_interleaved", "no_weight_halves"])
@pytest.mark.parametrize("heads_first", [False, True], ids=["tokens_first", "heads_first"])
@DTYPES
def test_rms_norm_rope(dt, heads_first, weighted):
    x, cos, sin, weights = inputs("rms_norm_rope", dt)
    if heads_first:
        xx, c, s = x.transpose(1, 2), cos[None, None], sin[None, None]
    else:
        xx, c, s = x, cos[None, :, None], sin[None, :, None]
    w, eps, inter = (weights[heads_first], 1e-6, True) if weighted else (None, None, False)
    args = (xx, w, eps, "fused", c, s, inter)
    assert trr.supported_layout(*args)
    check(trr.rms_norm_rope(*args), trope.rope(trms.rms_norm(xx, w, eps, "fused"), c, s, inter), True)


# rms_norm_cat_rope: text and image rows, each normalized with its own weight, then joined
@pytest.mark.parametrize("weighted", [True, False], ids=["weights_interleaved", "no_weights_halves"])
@DTYPES
def test_rms_norm_cat_rope(dt, weighted):
    xt, xi, cos, sin, w0, w1 = inputs("rms_norm_cat_rope", dt)
    c, s = cos[None, :, None], sin[None, :, None]
    w0, w1, eps, inter = (w0, w1, 1e-6, True) if weighted else (None, None, None, False)
    args = (xt, w0, xi, w1, eps, "fused", c, s, inter)
    assert trr.supported_layout_cat(*args)
    joined = torch.cat([trms.rms_norm(xt, w0, eps, "fused"), trms.rms_norm(xi, w1, eps, "fused")], 1)
    check(trr.rms_norm_cat_rope(*args), trope.rope(joined, c, s, inter), True)


@DTYPES
def test_rms_norm_rope_refused(dt):
    x, xt, xi, cos, sin, x64 = inputs("rms_norm_rope_refused", dt)
    c, s = cos[None, :, None], sin[None, :, None]
    assert not trr.supported_layout_cat(xt, None, xi[:, :, :2], None, None, "fused", c, s, True)  # other heads
    assert not trr.supported_layout(x64, None, None, "fused", cos[:3, :64], sin[:3, :64], True)
    assert not trr.supported_layout(x, None, 1e-6, "diffusers", c, s, True)


# gelu_tanh_cat: Flux's attention output (a transposed view) beside the MLP half; a
# width that is not a block multiple; one row; blocks of head columns only (numpy's tanh is not CUDA's: a tolerance)
@pytest.mark.parametrize("form", GELU_TANH_CAT_FORMS)
@DTYPES
def test_gelu_tanh_cat(dt, form):
    head, x = inputs("gelu_tanh_cat", dt)[form]
    assert tgelu.supported_layout(head, x)
    got = tgelu.gelu_tanh_cat(head, x)
    check(got, gelu_tanh_cat_reference(head, x), False)
    assert torch.equal(got[..., :head.shape[-1]], head)   # the copied part is exact


@pytest.mark.parametrize("form", GELU_TANH_CAT_FORMS)
@DTYPES
def test_gelu_tanh_cat_head_alone(dt, form):
    """bind_head: the head's blocks alone, copied into a cat whose other columns stay as they were
    (sgdiff::linear_act_cat's GEMM writes them)."""
    head, x = inputs("gelu_tanh_cat", dt)[form]
    out = torch.full((*x.shape[:-1], head.shape[-1] + x.shape[-1]), 7.0, dtype=x.dtype)
    tgelu.bind_head(head, out[..., head.shape[-1]:])(head, out[..., head.shape[-1]:], out)
    assert torch.equal(out[..., :head.shape[-1]], head) and bool((out[..., head.shape[-1]:] == 7).all())


def test_refused_layouts():
    # refused: eager takes another ATen path or the tables are not fp32 math
    torch.manual_seed(0)
    assert not trms.supported_layout(torch.randn(4, 130), None, 1e-6, "diffusers")       # N % 4 at N >= 128
    assert not trms.supported_layout(torch.randn(1, 64), None, 1e-6, "diffusers")        # block.x widens
    assert not trms.supported_layout(torch.randn(64, 16), None, 1e-6, "diffusers")       # N < 32
    assert not trms.supported_layout(torch.randn(4, 130), None, 1e-6, "fused")            # Welford fallback
    assert not trms.supported_layout(torch.randn(4 * 128 + 1)[1:].view(4, 128), None, 1e-6, "fused")  # misaligned
    assert not trms.supported_layout(torch.randn(4, 128), torch.randn(128, dtype=torch.bfloat16), 1e-6, "fused")
    assert not tgelu.supported_layout(torch.randn(2, 3, 4), torch.randn(2, 4, 4))               # other rows
    assert not tgelu.supported_layout(torch.randn(2, 3, 4), torch.randn(2, 3, 4, dtype=torch.bfloat16))
    x = torch.randn(1, 4, 2, 16)
    assert not trope.supported_layout(x, torch.randn(4, 16, dtype=torch.float64)[None, :, None], x, True)
    assert not trope.supported_layout(x, torch.randn(5, 16)[None, :, None], x, True)      # wrong broadcast
