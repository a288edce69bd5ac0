"""Triton sgdiff::silu_mul and sgdiff::gelu_mul, bitwise equal to eager on CUDA.

Eager chain and its rounding steps::

    s = a / (1 + expf(-a))      # ATen's silu in fp32 (expf: libdevice __nv_expf, IEEE division),
                                # rounded to a.dtype (cuda_math.silu_rounded: for 16-bit a, a
                                # cheaper quotient that rounds as IEEE's does)
    y = s * b                   # fp32 product, rounded to promote(a, b)

gelu_mul (a GeGLU) takes ATen's exact GELU instead, ``(a * 0.5) * (1 + erff(a * M_SQRT1_2))`` in
fp32 (``cuda_math.gelu_erf``), rounded to a.dtype, then the same product.

Elementwise over the output (layout ``like(a)``), walked innermost dim last so that slices of
a projection and Sana's channels-last GLU read and write whole rows. Programs go in memory order
(a flat launch) where a row spans whole programs and ``b`` is read, as in SwiGLU's halves of
12288; Sana's GLU (rows of 5600, two a program) and the in-place conv epilogue are faster the
other way (measured: bench/results/README.md).

The same kernel is the epilogue of a biased convolution (sgdiff::conv_silu, conv_silu_mul).
cuDNN convolves without the bias and ATen adds it afterwards (``output.add_(bias)``: an fp32
sum rounded to the output dtype), so the kernel can take the convolution's bias-free output
and add each operand's bias itself, with that rounding, before the SiLU; and with no ``b``
it writes ``silu(a + bias)`` alone.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import like_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, gelu_erf, libdevice_options, silu_rounded, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import (
    DTYPES,
    TL_DTYPE,
    cached_plan,
    even_tiles,
    innermost_last,
    launch_rows,
    rows_fit,
    row_tile,
    tile_offsets,
)


@LeanKernel
@triton.jit
def _silu_mul_kernel(
    a_ptr, b_ptr, out_ptr,
    a_bias_ptr, b_bias_ptr,  # biases broadcast to the output (zero strides but the channel's)
    n_rows,
    n1: tl.constexpr, n2: tl.constexpr, D: tl.constexpr,  # the shape, compiled in: its divisions are multiplications
    # and the strides (a kernel per layout; a model has a few)
    so0: tl.constexpr, so1: tl.constexpr, so2: tl.constexpr, so3: tl.constexpr,
    sa0: tl.constexpr, sa1: tl.constexpr, sa2: tl.constexpr, sa3: tl.constexpr,
    sb0: tl.constexpr, sb1: tl.constexpr, sb2: tl.constexpr, sb3: tl.constexpr,
    sab0: tl.constexpr, sab1: tl.constexpr, sab2: tl.constexpr, sab3: tl.constexpr,
    sbb0: tl.constexpr, sbb1: tl.constexpr, sbb2: tl.constexpr, sbb3: tl.constexpr,
    SILU_DTYPE: tl.constexpr,  # a.dtype
    HAS_B: tl.constexpr,  # False: out = silu(a)
    HAS_BIAS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN: tl.constexpr,  # the blocks tile the rows exactly: no masks (row_tile)
    FLAT: tl.constexpr,  # launch_rows(flat=...)
    INTERPRET: tl.constexpr,
    EVICT: tl.constexpr = "",  # a's and b's eviction policy (_input_eviction)
    GELU: tl.constexpr = False,  # ATen's exact GELU of a rather than its SiLU (gelu_mul)
):
    rows, d, mask = row_tile(n_rows, D, BLOCK_R, BLOCK_D, FLAT, EVEN)
    grid_dependency_wait()
    a = tl.load(a_ptr + tile_offsets(rows, d, n1, n2, sa0, sa1, sa2, sa3), mask=mask, other=0.0,
                eviction_policy=EVICT)
    if HAS_BIAS:  # ATen's add_ of the bias: fp32 sum rounded to a.dtype
        ab = tl.load(a_bias_ptr + tile_offsets(rows, d, n1, n2, sab0, sab1, sab2, sab3),
                     mask=mask, other=0.0).to(tl.float32)
        a = (a.to(tl.float32) + ab).to(SILU_DTYPE)
    a = to_fp32(a)
    if GELU:
        s = gelu_erf(a, INTERPRET).to(SILU_DTYPE).to(tl.float32)
    else:
        s = silu_rounded(a, SILU_DTYPE, INTERPRET).to(tl.float32)
    if HAS_B:
        b = tl.load(b_ptr + tile_offsets(rows, d, n1, n2, sb0, sb1, sb2, sb3),
                    mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if HAS_BIAS:
            bb = tl.load(b_bias_ptr + tile_offsets(rows, d, n1, n2, sbb0, sbb1, sbb2, sbb3),
                         mask=mask, other=0.0).to(tl.float32)
            b = (b + bb).to(b_ptr.dtype.element_ty).to(tl.float32)
        s = s * b
    o = out_ptr + tile_offsets(rows, d, n1, n2, so0, so1, so2, so3)
    tl.store(o, s.to(out_ptr.dtype.element_ty), mask=mask)


def supported_layout(a, b, wide_silu=False) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not (a.dtype in DTYPES and b.dtype in DTYPES and 1 <= a.dim() <= 4 and a.numel() > 0
            and rows_fit(a, 1)):
        return False
    if b.device != a.device or b.dim() > a.dim():
        return False
    try:
        return tuple(torch.broadcast_shapes(a.shape, b.shape)) == tuple(a.shape)
    except RuntimeError:
        return False


def can_use(a, b, wide_silu=False) -> bool:
    return a.is_cuda and supported_layout(a, b)


@cached_plan
def _plan(a, b, a_bias, b_bias):
    """``a_bias``/``b_bias``: None, or already viewed to broadcast against ``a``."""
    out = torch.empty_strided(a.shape, like_strides(a), device="meta")
    operands = [t if t is not None else a for t in (b, a_bias, b_bias)]  # a stands in for what is absent
    shape, (so, sa, sb, sab, sbb) = innermost_last(out, a, *operands)
    n_rows = shape[0] * shape[1] * shape[2]
    _, block_r, _ = launch_rows(n_rows, shape[3], max_block=1024)  # measured: 8 elements a thread
    flat = b is not None and block_r == 1
    grid, block_r, block_d = launch_rows(n_rows, shape[3], max_block=1024, flat=flat)
    ints = (n_rows, shape[1], shape[2], shape[3], *so, *sa, *sb, *sab, *sbb)
    return out.stride(), grid, ints, dict(BLOCK_R=block_r, BLOCK_D=block_d, FLAT=flat,
                                         EVEN=even_tiles(n_rows, shape[3], block_r, block_d))


def _input_eviction(a, b, l2_bytes: int) -> str:
    """``a`` and ``b`` (a gate and its other half: an activation's input, dead after it) are read
    evict-first where together they fit in L2 (``l2_bytes``), which then keeps the output for
    the next kernel. A stream larger than L2 passes through it anyway, and is slower with the
    hint (both measured: bench/results/README.md). Without ``b`` the output is written over
    ``a`` (conv_silu's epilogue): no hint."""
    if b is None:
        return ""
    read = a.numel() * a.element_size() + b.numel() * b.element_size()
    return "evict_first" if read <= l2_bytes else ""


def _bind(a, b, a_bias, b_bias, gelu: bool = False):
    """The launch for inputs of this signature: ``launch(a, b, a_bias, b_bias, out=None)``;
    ``gelu``: the exact GELU of a (gelu_mul) rather than its SiLU."""
    out_strides, grid, ints, blocks = _plan(a, b, a_bias, b_bias)
    shape, dtype = a.shape, a.dtype if b is None else torch.promote_types(a.dtype, b.dtype)
    l2_bytes = torch.cuda.get_device_properties(a.device).L2_cache_size if a.is_cuda else 0
    kernel = _silu_mul_kernel.bind(
        grid, SILU_DTYPE=TL_DTYPE[a.dtype], HAS_B=b is not None, HAS_BIAS=a_bias is not None, **blocks,
        INTERPRET=INTERPRET, EVICT=_input_eviction(a, b, l2_bytes), GELU=gelu, num_warps=4, enable_fp_fusion=False,
        **libdevice_options())

    def launch(a, b, a_bias, b_bias, out=None):
        if out is None:
            out = torch.empty_strided(shape, out_strides, dtype=dtype, device=a.device)
        kernel(a, a if b is None else b, out, a if a_bias is None else a_bias, a if b_bias is None else b_bias, *ints)
        return out

    return launch


def bind(a, b, wide_silu=False):
    """:func:`silu_mul` for inputs of this signature, its host arithmetic done (``wide_silu``
    computes what the plain SiLU does: ATen's fp32 SiLU, rounded to a's dtype)."""
    launch = _bind(a, b, None, None)
    return lambda a, b, *_: launch(a, b, None, None)


def silu_mul(a, b, wide_silu=False):
    """Launch; the caller has checked :func:`can_use`."""
    return _bind(a, b, None, None)(a, b, None, None)


# --- the epilogue of a biased convolution -----------------------------------------------

def channel_bias(bias, ndim: int):
    """A conv bias ``[C]`` viewed to broadcast over an ``ndim``-D output ``[N, C, ...]``."""
    return bias.view(-1, *(1,) * (ndim - 2))


def bias_silu_bind(y, bias):
    """``silu(y + bias)`` over a bias-free convolution output ``y``, written into ``y``:
    ``launch(y, bias)`` for outputs and biases of this signature."""
    launch = _bind(y, None, channel_bias(bias, y.dim()), None)
    return lambda y, bias: launch(y, None, channel_bias(bias, y.dim()), None, out=y)


def bias_silu_mul_bind(y, bias):
    """``a, g = (y + bias).chunk(2, 1); a * silu(g)`` over a bias-free convolution output ``y``:
    ``launch(y, bias)`` for outputs and biases of this signature."""
    half = y.shape[1] // 2

    def operands(y, bias):
        return (y.narrow(1, half, half), y.narrow(1, 0, half), channel_bias(bias[half:], y.dim()),
                channel_bias(bias[:half], y.dim()))

    launch = _bind(*operands(y, bias))
    return lambda y, bias: launch(*operands(y, bias))


def gelu_mul_bind(a, b):
    """:func:`gelu_mul` for inputs of this signature."""
    launch = _bind(a, b, None, None, gelu=True)
    return lambda a, b, *_: launch(a, b, None, None)


def gelu_mul(a, b):
    """Launch; the caller has checked :func:`supported_layout` (on CUDA)."""
    return gelu_mul_bind(a, b)(a, b)


SILU_MUL = Impl(run=silu_mul, supports=supported_layout, bind=bind)
GELU_MUL = Impl(run=gelu_mul, supports=supported_layout, bind=gelu_mul_bind)
