"""Triton sgdiff::silu_mul, bitwise equal to eager on CUDA.

Eager chain and its rounding steps::

    s = a / (1 + expf(-a))      # ATen's silu in fp32 (expf: libdevice __nv_expf, IEEE division),
                                # rounded to a.dtype
    y = s * b                   # fp32 product, rounded to promote(a, b)

Elementwise over the output (layout ``like(a)``), walked innermost dim last so that slices of
a projection and Sana's channels-last GLU read and write whole rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import like_strides
from sgdiff.kernels.triton.cuda_math import INTERPRET, expf, libdevice_options
from sgdiff.kernels.triton.launch import LeanKernel
from sgdiff.kernels.triton.rows import (
    DTYPES,
    TL_DTYPE,
    cached_plan,
    innermost_last,
    launch_rows,
    row_offsets,
)


@LeanKernel
@triton.jit
def _silu_mul_kernel(
    a_ptr, b_ptr, out_ptr,
    n_rows, n1, n2, D,
    so0, so1, so2, so3,
    sa0, sa1, sa2, sa3,
    sb0, sb1, sb2, sb3,
    SILU_DTYPE: tl.constexpr,  # a.dtype
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (d < D)[None, :]
    a = tl.load(a_ptr + row_offsets(rows, n1, n2, sa0, sa1, sa2)[:, None] + d[None, :] * sa3,
                mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row_offsets(rows, n1, n2, sb0, sb1, sb2)[:, None] + d[None, :] * sb3,
                mask=mask, other=0.0).to(tl.float32)
    s = tl.math.div_rn(a, 1.0 + expf(a * -1.0, INTERPRET)).to(SILU_DTYPE).to(tl.float32)
    o = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None] + d[None, :] * so3
    tl.store(o, (s * b).to(out_ptr.dtype.element_ty), mask=mask)


def supported_layout(a, b) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not (a.dtype in DTYPES and b.dtype in DTYPES and 1 <= a.dim() <= 4 and a.numel() > 0):
        return False
    if b.device != a.device or b.dim() > a.dim():
        return False
    try:
        return tuple(torch.broadcast_shapes(a.shape, b.shape)) == tuple(a.shape)
    except RuntimeError:
        return False


def can_use(a, b) -> bool:
    return a.is_cuda and supported_layout(a, b)


@cached_plan
def _plan(a, b):
    out = torch.empty_strided(a.shape, like_strides(a), device="meta")
    shape, (so, sa, sb) = innermost_last(out, a, b)
    n_rows = shape[0] * shape[1] * shape[2]
    grid, block_r, block_d = launch_rows(n_rows, shape[3], max_block=1024)  # measured: 8 elements per thread
    return out.stride(), grid, (n_rows, shape[1], shape[2], shape[3], *so, *sa, *sb), dict(BLOCK_R=block_r,
                                                                                         BLOCK_D=block_d)


def silu_mul(a, b):
    """Launch; the caller has checked :func:`can_use`."""
    out_strides, grid, ints, blocks = _plan(a, b)
    out = torch.empty_strided(a.shape, out_strides, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    _silu_mul_kernel[grid](
        a, b, out, *ints, SILU_DTYPE=TL_DTYPE[a.dtype], **blocks,
        INTERPRET=INTERPRET, num_warps=4, enable_fp_fusion=False, **libdevice_options(),
    )
    return out


silu_mul.can_use = can_use
