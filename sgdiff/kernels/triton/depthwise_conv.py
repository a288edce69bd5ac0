"""A depthwise 2-D convolution summed as cuDNN sums it, with the gated SiLU of its two channel
halves in the same pass (Sana's ``GLUMBConv``: ``conv_depth``, ``chunk(2, dim=1)``, ``a * silu(g)``).

Eager runs a biased depthwise convolution of a 16-bit channels-last map on cuDNN, and ATen then
adds the bias (``output.add_(bias)``: an fp32 sum, rounded). The kernel sums each output's taps
as a direct convolution does: in fp32, one product at a time in the filter's row-major order
(or column-major, in one variant), rounded once to the map's dtype. A product of two 16-bit
values is exact in fp32, so whether the multiply and the add fuse does not matter; only the
order of the sum does, and cuDNN's kernels do not document theirs: first sight compares the
bits with cuDNN's at each signature, and a variant whose order is not cuDNN's drops out. The silu_mul kernel's arithmetic follows
(:mod:`sgdiff.kernels.triton.silu_mul`): ``silu`` of the second half, rounded, times the
first half, rounded.

cuDNN's kernel writes the whole convolution output and ATen's bias add reads and writes it
again before the GLU reads it a third time; here a program walks a strip of output rows (up to
64 columns and 32 to 128 channels of each half), one row after the other, so that the input rows
a row's taps read are read again, from L1, by the next row's, and writes only the GLU's output. Whether the
bits are cuDNN's for a signature is what first sight checks (the op is tuned: this is one of
its variants beside cuDNN + the epilogue kernel).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import channels_last_strides, is_channels_last
from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options, silu_rounded, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import TL_DTYPE

HALF_DTYPES = (torch.bfloat16, torch.float16)  # what cuDNN's depthwise kernel sums as described
MAX_TAPS = 49  # up to a 7x7 filter: the taps are unrolled


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
    COLUMNS: tl.constexpr,  # the taps in column-major order rather than row-major
    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    INTERPRET: tl.constexpr,
):
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
    for r in range(ROWS):  # a row's taps are the next row's too: read again from L1
        ho = wo * 0 + (strip % tl.cdiv(Ho, ROWS)) * ROWS + r  # a vector: scalar masks trip the interpreter
        acc_a = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
        acc_g = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
        for t in tl.static_range(KH * KW):  # the filter's taps in order, one fp32 sum each
            if COLUMNS:
                i, j = t % KH, t // KH
            else:
                i, j = t // KW, t % KW
            hi = ho * STRIDE_H - PAD_H + i * DIL_H
            wi = wo * STRIDE_W - PAD_W + j * DIL_W
            inside = w_ok & (wi >= 0) & (wi < W) & (hi >= 0) & (hi < H) & (ho < Ho)
            pixels = x_sample + hi.to(tl.int64) * sx2 + wi.to(tl.int64) * sx3
            mask = inside[:, None] & c_ok[None, :]
            xa = to_fp32(tl.load(pixels[:, None] + a_cols[None, :], mask=mask, other=0.0))
            xg = to_fp32(tl.load(pixels[:, None] + g_cols[None, :], mask=mask, other=0.0))
            wa = tl.load(w_ptr + c * sw0 + (i * KW + j), mask=c_ok, other=0.0).to(tl.float32)
            wg = tl.load(w_ptr + (c + half) * sw0 + (i * KW + j), mask=c_ok, other=0.0).to(tl.float32)
            acc_a = acc_a + xa * wa[None, :]
            acc_g = acc_g + xg * wg[None, :]
        # cuDNN's rounding, then ATen's add_ of the bias (an fp32 sum, rounded)
        a = (acc_a.to(DTYPE).to(tl.float32) + ba[None, :]).to(DTYPE).to(tl.float32)
        g = (acc_g.to(DTYPE).to(tl.float32) + bg[None, :]).to(DTYPE)
        s = silu_rounded(to_fp32(g), DTYPE, INTERPRET).to(tl.float32)
        o = out_ptr + b * so0 + (ho.to(tl.int64) * so2 + wo.to(tl.int64) * so3)[:, None] + c.to(tl.int64)[None, :] * so1
        tl.store(o, (s * a).to(DTYPE), mask=(w_ok & (ho < Ho))[:, None] & c_ok[None, :])


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
    return all(o > 0 for o in output_size(x, weight, stride, padding, dilation))


def output_size(x, weight, stride, padding, dilation) -> tuple:
    """The convolution's output rows and columns."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                 zip(x.shape[2:], weight.shape[2:], stride, padding, dilation))


def output_strides(x, shape) -> tuple:
    """Eager's layout for the GLU's output: cuDNN writes channels-last for a channels-last map,
    and the GLU keeps the layout of its halves."""
    if is_channels_last(x):
        return tuple(channels_last_strides(shape))
    return torch.empty(shape, device="meta").stride()


def _configs(Ho: int, Wo: int) -> list:
    """The tilings first sight tries: a row's columns (up to 64) a program, 32 to 128 channels,
    and strips of 1 to 8 rows (Sana's 32 x 32 maps: whole rows, so each tap's row is one load);
    the taps row-major, and once column-major."""
    block_w = min(64, triton.next_power_of_2(Wo))
    found = []
    for block_c, rows, warps in ((64, 4, 4), (64, 8, 4), (32, 8, 2), (128, 4, 8), (64, 1, 4)):
        config = dict(BLOCK_W=block_w, BLOCK_C=block_c, ROWS=min(rows, Ho), COLUMNS=False, num_warps=warps)
        if config not in found:
            found.append(config)
    # the taps in column-major order, in the first tiling: a cuDNN that sums them so keeps a kernel
    return found + [dict(found[0], COLUMNS=True)]


def bind(x, weight, bias, stride, padding, dilation, groups, config=None):
    """The launch for inputs of this signature (``config``: a tiling of :func:`_configs`, the
    first by default): ``launch(x, weight, bias, *geometry)`` returns the GLU's output."""
    B, C, H, W = x.shape
    half = C // 2
    Ho, Wo = output_size(x, weight, stride, padding, dilation)
    config = dict(config or _configs(Ho, Wo)[0])
    shape = (B, half, Ho, Wo)
    strides = output_strides(x, shape)
    rows, block_w, block_c = config.pop("ROWS"), config.pop("BLOCK_W"), config.pop("BLOCK_C")
    grid = (B * triton.cdiv(Ho, rows), triton.cdiv(Wo, block_w), triton.cdiv(half, block_c))
    kernel = _depthwise_glu_kernel.bind(
        grid, H=H, W=W, Ho=Ho, Wo=Wo, sx1=x.stride(1), so1=strides[1], sw0=weight.stride(0),
        KH=weight.shape[2], KW=weight.shape[3], STRIDE_H=stride[0], STRIDE_W=stride[1], PAD_H=padding[0],
        PAD_W=padding[1], DIL_H=dilation[0], DIL_W=dilation[1], DTYPE=TL_DTYPE[x.dtype], ROWS=rows,
        COLUMNS=config.pop("COLUMNS", False),
        BLOCK_W=block_w, BLOCK_C=block_c, INTERPRET=INTERPRET, enable_fp_fusion=False, **config,
        **libdevice_options())
    sx0, _, sx2, sx3 = x.stride()
    so0, _, so2, so3 = strides

    def launch(x, weight, bias, *geometry):
        out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
        kernel(x, weight, bias, out, half, sx0, sx2, sx3, so0, so2, so3)
        return out

    return launch


def variants(x, weight, bias, stride, padding, dilation, groups) -> list:
    """Every tiling of :func:`_configs`, labelled, for first sight to verify and time."""
    Ho, Wo = output_size(x, weight, stride, padding, dilation)
    return [(f"depthwise {c['ROWS']}x{c['BLOCK_W']}x{c['BLOCK_C']} w{c['num_warps']}" + " columns" * c["COLUMNS"],
             bind(x, weight, bias, stride, padding, dilation, groups, c)) for c in _configs(Ho, Wo)]
