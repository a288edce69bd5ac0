"""A depthwise 2-D convolution summed as cuDNN sums it, with the gated SiLU of its two channel
halves in the same pass (Sana's ``GLUMBConv``: ``conv_depth``, ``chunk(2, dim=1)``, ``a * silu(g)``).

Eager runs a biased depthwise convolution of a 16-bit channels-last map on cuDNN
(``conv2d_c1_k1_nhwc`` on an H100), and ATen then adds the bias (``output.add_(bias)``: an fp32
sum, rounded). cuDNN sums each output's taps in fp32 in the filter's row-major order and rounds
once: of the 9! orders of a 3x3 filter's products, only that one gives its bits at Sana's maps
in bf16 and fp16 (bench/results/runs/depthwise-order-probe-h100-98afa15.json). A product of two
16-bit values is exact in fp32, so a fused multiply-add rounds as the plain sum does. First
sight still compares the bits with cuDNN's at each signature.

cuDNN's kernel writes the whole convolution output and ATen's bias add reads and writes it
again before the GLU reads it a third time; here one kernel reads the map and writes only the
GLU's output. For a filter three rows tall (stride and dilation 1: Sana's 3x3), a program walks
the input rows of a strip once, each row serving the three output rows it is a filter row of,
so that each input row is loaded once for each filter column; any other geometry takes a kernel
that reads each output row's taps where they lie (from L1 after the first touch).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import channels_last_strides, contiguous_strides, is_channels_last
from sgdiff.kernels.triton.conv_bias import conv_spatial_size
from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options, silu_rounded, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import TL_DTYPE

HALF_DTYPES = (torch.bfloat16, torch.float16)  # what cuDNN's depthwise kernel sums as described
MAX_TAPS = 49  # up to a 7x7 filter: the taps are unrolled


@triton.jit
def _glu(acc_a, acc_g, ba, bg, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """The two halves' sums rounded as cuDNN rounds them, ATen's add_ of the bias (an fp32 sum,
    rounded), then silu_mul's ``silu(g)`` rounded, times ``a``."""
    a = (acc_a.to(DTYPE).to(tl.float32) + ba[None, :]).to(DTYPE).to(tl.float32)
    g = (acc_g.to(DTYPE).to(tl.float32) + bg[None, :]).to(DTYPE)
    s = silu_rounded(to_fp32(g), DTYPE, INTERPRET).to(tl.float32)
    return (s * a).to(DTYPE)


@LeanKernel
@triton.jit
def _depthwise_glu_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    half,  # channels of each half
    sx0, sx2, sx3, so0, so2, so3,  # the strides of a sample, a row, a column
    H: tl.constexpr, W: tl.constexpr, Ho: tl.constexpr, Wo: tl.constexpr,
    sx1: tl.constexpr, so1: tl.constexpr,  # a channel's stride (1 channels-last)
    sw0: tl.constexpr,  # a channel's filter stride (the filter is contiguous: KH * KW)
    KH: tl.constexpr, KW: tl.constexpr,
    STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
    DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    DTYPE: tl.constexpr,
    ROWS: tl.constexpr,  # output rows a program walks, one after the other
    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Any geometry: each output row's taps read where they lie (again from L1 for the next row)."""
    strip = tl.program_id(0)  # (sample, strip of ROWS output rows)
    b = (strip // tl.cdiv(Ho, ROWS)).to(tl.int64)
    wo = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    w_ok, c_ok = wo < Wo, c < half
    a_cols, g_cols = c.to(tl.int64) * sx1, (c + half).to(tl.int64) * sx1
    x_sample = x_ptr + b * sx0
    grid_dependency_wait()
    ba = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    bg = tl.load(bias_ptr + half + c, mask=c_ok, other=0.0).to(tl.float32)
    for r in range(ROWS):
        ho = wo * 0 + (strip % tl.cdiv(Ho, ROWS)) * ROWS + r  # a vector: scalar masks trip the interpreter
        acc_a = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
        acc_g = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
        for t in tl.static_range(KH * KW):  # the filter's taps in row-major order, one fp32 sum each
            i, j = t // KW, t % KW
            hi = ho * STRIDE_H - PAD_H + i * DIL_H
            wi = wo * STRIDE_W - PAD_W + j * DIL_W
            inside = w_ok & (wi >= 0) & (wi < W) & (hi >= 0) & (hi < H) & (ho < Ho)
            pixels = x_sample + hi.to(tl.int64) * sx2 + wi.to(tl.int64) * sx3
            mask = inside[:, None] & c_ok[None, :]
            xa = to_fp32(tl.load(pixels[:, None] + a_cols[None, :], mask=mask, other=0.0))
            xg = to_fp32(tl.load(pixels[:, None] + g_cols[None, :], mask=mask, other=0.0))
            wa = tl.load(w_ptr + c * sw0 + t, mask=c_ok, other=0.0).to(tl.float32)
            wg = tl.load(w_ptr + (c + half) * sw0 + t, mask=c_ok, other=0.0).to(tl.float32)
            acc_a = tl.fma(xa, wa[None, :], acc_a)  # the product is exact: one rounding, as a plain sum's
            acc_g = tl.fma(xg, wg[None, :], acc_g)
        o = out_ptr + b * so0 + (ho.to(tl.int64) * so2 + wo.to(tl.int64) * so3)[:, None] + c.to(tl.int64)[None, :] * so1
        tl.store(o, _glu(acc_a, acc_g, ba, bg, DTYPE, INTERPRET), mask=(w_ok & (ho < Ho))[:, None] & c_ok[None, :])


@LeanKernel
@triton.jit
def _depthwise3_glu_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    half,
    sx0, sx2, sx3, so0, so2, so3,
    H: tl.constexpr, W: tl.constexpr, Ho: tl.constexpr, Wo: tl.constexpr,
    sx1: tl.constexpr, so1: tl.constexpr, sw0: tl.constexpr,
    KW: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
    DTYPE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """A filter three rows tall, stride and dilation 1: a program walks the input rows of a strip
    once, each row read at its KW column offsets, and each serves three output rows' sums as the
    filter row it is for them (row 0 of the output it starts, 1 of the next older, 2 of the oldest,
    which it completes): each output's taps still go in row-major order."""
    strip = tl.program_id(0)
    b = (strip // tl.cdiv(Ho, ROWS)).to(tl.int64)
    first = (strip % tl.cdiv(Ho, ROWS)) * ROWS
    wo = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    w_ok, c_ok = wo < Wo, c < half
    a_cols, g_cols = c.to(tl.int64) * sx1, (c + half).to(tl.int64) * sx1
    a_filter, g_filter = w_ptr + c * sw0, w_ptr + (c + half) * sw0
    x_sample = x_ptr + b * sx0
    o_sample = out_ptr + b * so0 + c.to(tl.int64)[None, :] * so1
    grid_dependency_wait()
    ba = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    bg = tl.load(bias_ptr + half + c, mask=c_ok, other=0.0).to(tl.float32)
    a0 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)  # the output row r + PAD_H (filter row 0 next)
    a1 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)  # r + PAD_H - 1 (filter row 1 next)
    a2 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)  # r + PAD_H - 2 (filter row 2 next: the last)
    g0 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
    g1 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
    g2 = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
    for k in range(ROWS + 2):
        r = wo * 0 + first - PAD_H + k  # the input row (a vector: scalar masks trip the interpreter)
        row_ok = w_ok & (r >= 0) & (r < H)
        for j in tl.static_range(KW):
            wi = wo - PAD_W + j
            mask = (row_ok & (wi >= 0) & (wi < W))[:, None] & c_ok[None, :]
            pixels = (x_sample + r.to(tl.int64) * sx2 + wi.to(tl.int64) * sx3)[:, None]
            xa = to_fp32(tl.load(pixels + a_cols[None, :], mask=mask, other=0.0))
            xg = to_fp32(tl.load(pixels + g_cols[None, :], mask=mask, other=0.0))
            a2 = tl.fma(xa, tl.load(a_filter + (2 * KW + j), mask=c_ok, other=0.0).to(tl.float32)[None, :], a2)
            g2 = tl.fma(xg, tl.load(g_filter + (2 * KW + j), mask=c_ok, other=0.0).to(tl.float32)[None, :], g2)
            a1 = tl.fma(xa, tl.load(a_filter + (KW + j), mask=c_ok, other=0.0).to(tl.float32)[None, :], a1)
            g1 = tl.fma(xg, tl.load(g_filter + (KW + j), mask=c_ok, other=0.0).to(tl.float32)[None, :], g1)
            a0 = tl.fma(xa, tl.load(a_filter + j, mask=c_ok, other=0.0).to(tl.float32)[None, :], a0)
            g0 = tl.fma(xg, tl.load(g_filter + j, mask=c_ok, other=0.0).to(tl.float32)[None, :], g0)
        ho = r + PAD_H - 2  # complete now
        done = w_ok & (ho >= first) & (ho < first + ROWS) & (ho < Ho)
        o = o_sample + (ho.to(tl.int64) * so2 + wo.to(tl.int64) * so3)[:, None]
        tl.store(o, _glu(a2, g2, ba, bg, DTYPE, INTERPRET), mask=done[:, None] & c_ok[None, :])
        a2, a1, a0 = a1, a0, tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
        g2, g1, g0 = g1, g0, tl.zeros([BLOCK_W, BLOCK_C], tl.float32)


def supported_layout(x, weight, bias, stride, padding, dilation, groups) -> bool:
    """A 2-D depthwise convolution (one filter a channel) of a 16-bit map, biased, with an even
    number of channels for the two halves, its filter contiguous and at most :data:`MAX_TAPS`
    taps; ``x`` contiguous or channels-last. The device and the backend are the caller's."""
    if not (x.dim() == 4 and weight.dim() == 4 and x.dtype in HALF_DTYPES and bias is not None
            and weight.dtype == bias.dtype == x.dtype and x.numel() > 0):
        return False
    C = x.shape[1]
    if not (groups == C and tuple(weight.shape[:2]) == (C, 1) and C % 2 == 0 and bias.shape == (C,)
            and weight.is_contiguous() and bias.is_contiguous()):
        return False
    if weight.shape[2] * weight.shape[3] > MAX_TAPS or not (x.is_contiguous() or is_channels_last(x)):
        return False
    return all(o > 0 for o in conv_spatial_size(x, weight, stride, padding, dilation))


def output_strides(x, shape) -> tuple:
    """Eager's layout for the GLU's output: cuDNN writes channels-last for a channels-last map,
    and the GLU keeps the layout of its halves."""
    if is_channels_last(x):
        return tuple(channels_last_strides(shape))
    return tuple(contiguous_strides(shape))


def rolls(weight, stride, dilation) -> bool:
    """Whether the three-row kernel computes this geometry (a filter three rows tall, stride and
    dilation 1)."""
    return weight.shape[2] == 3 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)


def _configs(Ho: int, Wo: int, three_rows: bool) -> list:
    """The tilings first sight tries: a row's columns (up to 64) a program, 32 or 64 channels of
    each half, strips of rows; the three-row kernel where it applies, beside one of the other."""
    block_w = min(64, triton.next_power_of_2(Wo))
    direct = [dict(BLOCK_W=block_w, BLOCK_C=block_c, ROWS=min(rows, Ho), num_warps=warps)
              for block_c, rows, warps in ((64, 8, 4), (64, 1, 4), (32, 8, 2))]
    if not three_rows:
        return _distinct(direct)
    # the fastest on an H100 at Sana's 32 x 32 maps first (63.5 us), then at 64 x 64 (112.6) and at small
    # maps (25.3); each tiling's time swings twofold with the map's width (registers, programs a wave):
    # bench/results/runs/depthwise-kernel-probe-h100-36e1c53.json
    rolled = [dict(BLOCK_W=block_w, BLOCK_C=block_c, ROWS=min(rows, Ho), num_warps=warps, ROLL=True)
              for block_c, rows, warps in ((32, 8, 2), (64, 16, 4), (32, 16, 4), (64, 8, 8))]
    return _distinct(rolled + direct[:1])


def _distinct(configs: list) -> list:
    """``configs`` without repeats (a map shorter than a strip makes several tilings one)."""
    return [c for i, c in enumerate(configs) if c not in configs[:i]]


def bind(x, weight, bias, stride, padding, dilation, groups, config=None):
    """The launch for inputs of this signature (``config``: a tiling of :func:`_configs`, the
    first by default): ``launch(x, weight, bias, *geometry)`` returns the GLU's output."""
    B, C, H, W = x.shape
    half = C // 2
    Ho, Wo = conv_spatial_size(x, weight, stride, padding, dilation)
    config = dict(config or _configs(Ho, Wo, rolls(weight, stride, dilation))[0])
    shape = (B, half, Ho, Wo)
    strides = output_strides(x, shape)
    rows, block_w, block_c = config.pop("ROWS"), config.pop("BLOCK_W"), config.pop("BLOCK_C")
    grid = (B * triton.cdiv(Ho, rows), triton.cdiv(Wo, block_w), triton.cdiv(half, block_c))
    shared = dict(H=H, W=W, Ho=Ho, Wo=Wo, sx1=x.stride(1), so1=strides[1], sw0=weight.stride(0), KW=weight.shape[3],
                  PAD_H=padding[0], PAD_W=padding[1], DTYPE=TL_DTYPE[x.dtype], ROWS=rows, BLOCK_W=block_w,
                  BLOCK_C=block_c, INTERPRET=INTERPRET, enable_fp_fusion=False, **libdevice_options())
    if config.pop("ROLL", False):
        kernel = _depthwise3_glu_kernel.bind(grid, **shared, **config)
    else:
        kernel = _depthwise_glu_kernel.bind(grid, **shared, **config, KH=weight.shape[2], STRIDE_H=stride[0],
                                            STRIDE_W=stride[1], DIL_H=dilation[0], DIL_W=dilation[1])
    sx0, _, sx2, sx3 = x.stride()
    so0, _, so2, so3 = strides

    def launch(x, weight, bias, *geometry):
        out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
        kernel(x, weight, bias, out, half, sx0, sx2, sx3, so0, so2, so3)
        return out

    return launch


def variants(x, weight, bias, stride, padding, dilation, groups) -> list:
    """Every tiling of :func:`_configs`, labelled, for first sight to verify and time."""
    Ho, Wo = conv_spatial_size(x, weight, stride, padding, dilation)
    return [(f"depthwise{' 3-row' if c.get('ROLL') else ''} {c['ROWS']}x{c['BLOCK_W']}x{c['BLOCK_C']} w{c['num_warps']}",
             bind(x, weight, bias, stride, padding, dilation, groups, c))
            for c in _configs(Ho, Wo, rolls(weight, stride, dilation))]
