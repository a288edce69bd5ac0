"""Triton sgdiff::cast_copy, bitwise equal to eager on CUDA (nothing rounds).

One program copies a [BLOCK_I, BLOCK_J] tile of one [n0, n1] slice of a 4-D tensor: reads the
input through its strides, applies the ReLU as ATen's ``clamp_min`` does (NaN passes, else
``max(v, 0)``, PTX ``max`` like CUDA's ``::max``), casts, and writes the (padded) output
through its strides. Strides equal to 1 are constants to Triton, so a tile whose input is contiguous along
one axis and whose output along the other (Sana's transposed q) loads and stores whole rows,
with the transpose in between done by the compiler through shared memory.
"""
from __future__ import annotations

import triton
import triton.language as tl

from sgdiff.kernels.layout import contiguous_strides, like_strides
from sgdiff.kernels.triton.launch import LeanKernel, one_input_one_output
from sgdiff.kernels.triton.rows import DTYPES, cached_plan


@LeanKernel
@triton.jit
def _cast_copy_kernel(
    x_ptr, out_ptr,
    n1, I_IN, J_IN, I_OUT, J_OUT,  # slices per batch entry; input and output sizes of the last 2 dims
    sx0, sx1, sx2, sx3,
    so0, so1, so2, so3,
    value,  # the padding
    RELU: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    s = tl.program_id(0)  # (batch, head), split in 32 bits
    s0, s1 = (s // n1).to(tl.int64), (s % n1).to(tl.int64)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    j = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    inside = (i < I_IN)[:, None] & (j < J_IN)[None, :]
    src = x_ptr + s0 * sx0 + s1 * sx1 + i[:, None] * sx2 + j[None, :] * sx3
    v = tl.load(src, mask=inside, other=0.0)
    if RELU:  # ATen's clamp_min(v, 0) in the input's opmath (float): NaN passes, else max
        f = v.to(tl.float32)
        v = tl.where(f != f, f, tl.maximum(f, 0.0)).to(x_ptr.dtype.element_ty)
    y = tl.where(inside, v.to(out_ptr.dtype.element_ty), value).to(out_ptr.dtype.element_ty)
    dst = out_ptr + s0 * so0 + s1 * so1 + i[:, None] * so2 + j[None, :] * so3
    tl.store(dst, y, mask=(i < I_OUT)[:, None] & (j < J_OUT)[None, :])


def supported_layout(x, dtype, relu, pad, value, contiguous) -> bool:
    """can_use without the device check: a 4-D float tensor, a float dtype, padding only after
    the last two dims' ends (as ``F.pad(v, (0, 0, 0, 1))``)."""
    if not (x.dim() == 4 and x.dtype in DTYPES and dtype in DTYPES and x.numel() > 0):
        return False
    pad = list(pad)
    return len(pad) <= 4 and all(p >= 0 for p in pad) and all(p == 0 for p in pad[0::2])


def can_use(x, dtype, relu, pad, value, contiguous) -> bool:
    return x.is_cuda and supported_layout(x, dtype, relu, pad, value, contiguous)


@cached_plan
def _plan(x, pad, contiguous):
    pad = list(pad) + [0] * (4 - len(pad))
    shape = (*x.shape[:2], x.shape[2] + pad[3], x.shape[3] + pad[1])
    strides = contiguous_strides(shape) if contiguous or any(pad) else like_strides(x)
    # the whole of a head's rows a tile, up to 64: Sana's v padded to 33 rows takes one 64 x 64 tile
    # rather than 32 x 128 and a tile of one row (H200, one run: 6.9 -> 6.5 µs; q's 32 rows unchanged)
    block_i = min(64, triton.next_power_of_2(shape[2]))
    block_j = max(16, min(128, 4096 // block_i, triton.next_power_of_2(shape[3])))
    grid = (shape[0] * shape[1], triton.cdiv(shape[2], block_i), triton.cdiv(shape[3], block_j))
    ints = (x.shape[1], x.shape[2], x.shape[3], shape[2], shape[3], *x.stride(), *strides)
    return shape, strides, grid, ints, dict(BLOCK_I=block_i, BLOCK_J=block_j)


def bind(x, dtype, relu, pad, value, contiguous):
    """:func:`cast_copy` for inputs of this signature, its host arithmetic done."""
    shape, strides, grid, ints, blocks = _plan(x, tuple(pad), bool(contiguous))
    kernel = _cast_copy_kernel.bound(grid, RELU=bool(relu), **blocks, num_warps=4)
    return one_input_one_output(kernel, shape, strides, dtype, *ints, float(value))


def cast_copy(x, dtype, relu, pad, value, contiguous):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, dtype, relu, pad, value, contiguous)(x)


cast_copy.can_use, cast_copy.bind = can_use, bind
