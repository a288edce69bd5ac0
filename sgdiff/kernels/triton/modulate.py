"""Triton sgdiff::modulate, bitwise equal to eager on CUDA.

Eager chain and its rounding steps::

    s = scale + 1       # fp32 sum, rounded to scale.dtype
    y = x * s           # fp32 product, rounded to promote(x, scale)
    y = y + shift       # fp32 sum, rounded to promote(y, shift); no shift: y itself

Elementwise over the contiguous output, each operand read through its broadcast strides (a
[B, 1, D] table row or a chunk of a projection needs no copy), rows walked innermost dim last.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from sgdiff.kernels.registry import Impl

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
def _modulate_kernel(
    x_ptr, scale_ptr, shift_ptr, out_ptr,
    n_rows,
    n1: tl.constexpr, n2: tl.constexpr, D: tl.constexpr,  # the shape, compiled in: its divisions are multiplications
    so0, so1, so2, so3,
    sx0, sx1, sx2, sx3,
    sc0, sc1, sc2, sc3,
    sh0, sh1, sh2, sh3,
    PRODUCT_DTYPE: tl.constexpr,  # promote(x, scale)
    HAS_SHIFT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN: tl.constexpr,  # the blocks tile the rows exactly: no masks (row_tile)
):
    rows, d, mask = row_tile(n_rows, D, BLOCK_R, BLOCK_D, False, EVEN)
    grid_dependency_wait()
    x = tl.load(x_ptr + tile_offsets(rows, d, n1, n2, sx0, sx1, sx2, sx3), mask=mask, other=0.0)
    s = tl.load(scale_ptr + tile_offsets(rows, d, n1, n2, sc0, sc1, sc2, sc3), mask=mask,
                other=0.0)
    h = None
    if HAS_SHIFT:
        h = tl.load(shift_ptr + tile_offsets(rows, d, n1, n2, sh0, sh1, sh2, sh3), mask=mask,
                    other=0.0)
    y = modulated(x, s, h, PRODUCT_DTYPE)
    o = out_ptr + tile_offsets(rows, d, n1, n2, so0, so1, so2, so3)
    tl.store(o, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def modulated(x, s, h, PRODUCT_DTYPE: tl.constexpr):
    """``x * (1 + s) + h`` (``h`` None: no shift) rounded as eager's chain rounds it: ``1 + s`` to
    s's dtype, the product to ``PRODUCT_DTYPE`` (promote(x, s)), the sum in fp32, to be rounded
    by the caller's store to promote(product, h)."""
    s = (s.to(tl.float32) + 1.0).to(s.dtype)
    y = (x.to(tl.float32) * s.to(tl.float32)).to(PRODUCT_DTYPE)
    if h is not None:
        y = y.to(tl.float32) + h.to(tl.float32)
    return y


def out_dtypes(x_dtype: torch.dtype, scale, shift) -> tuple:
    """``(product, output)`` dtypes of eager's modulation of a ``x_dtype`` tensor."""
    product = torch.promote_types(x_dtype, scale.dtype)
    return product, product if shift is None else torch.promote_types(product, shift.dtype)


def supported_layout(x, scale, shift) -> bool:
    """can_use without the device check: float operands of at most 4 dims that broadcast to x."""
    operands = [t for t in (x, scale, shift) if t is not None]
    if not (1 <= x.dim() <= 4 and x.numel() > 0 and rows_fit(x, 1)):
        return False
    if any(t.dtype not in DTYPES or t.device != x.device or t.dim() > x.dim() for t in operands):
        return False
    try:
        return tuple(torch.broadcast_shapes(*(t.shape for t in operands))) == tuple(x.shape)
    except RuntimeError:
        return False


def can_use(x, scale, shift) -> bool:
    return x.is_cuda and supported_layout(x, scale, shift)


@cached_plan
def _plan(x, scale, shift):
    product, out_dtype = out_dtypes(x.dtype, scale, shift)
    out = torch.empty(x.shape, device="meta")  # contiguous, as the chain's last op leaves it
    shape, (so, sx, sc, sh) = innermost_last(out, x, scale, x if shift is None else shift)
    n_rows = shape[0] * shape[1] * shape[2]
    grid, block_r, block_d = launch_rows(n_rows, shape[3], max_block=2048)
    ints = (n_rows, shape[1], shape[2], shape[3], *so, *sx, *sc, *sh)
    return out_dtype, grid, ints, dict(PRODUCT_DTYPE=TL_DTYPE[product], BLOCK_R=block_r, BLOCK_D=block_d,
                                      EVEN=even_tiles(n_rows, shape[3], block_r, block_d))


def bind(x, scale, shift):
    """:func:`modulate` for inputs of this signature, its host arithmetic done."""
    out_dtype, grid, ints, consts = _plan(x, scale, shift)
    kernel = _modulate_kernel.bind(grid, HAS_SHIFT=shift is not None, **consts, num_warps=4, enable_fp_fusion=False)
    shape = x.shape

    def launch(x, scale, shift):
        out = torch.empty(shape, dtype=out_dtype, device=x.device)
        kernel(x, scale, x if shift is None else shift, out, *ints)
        return out

    return launch


def modulate(x, scale, shift):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, scale, shift)(x, scale, shift)


MODULATE = Impl(run=modulate, supports=supported_layout, bind=bind)
