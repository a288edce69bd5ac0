"""Triton sgdiff::cast_copy, bitwise equal to eager on CUDA (nothing rounds).

One program copies a [BLOCK_I, BLOCK_J] tile of one [n0, n1] slice of a 4-D tensor: reads the
input through its strides, applies the ReLU as ATen's ``clamp_min`` does (NaN passes, else
``max(v, 0)``, PTX ``max`` like CUDA's ``::max``), casts, and writes the (padded) output
through its strides. Sizes and strides are compiled in, so a tile whose input is contiguous
along one axis and whose output along the other (Sana's transposed q) loads and stores whole
rows, with the transpose in between done by the compiler through shared memory, and its index
arithmetic and masks fold to a few constant multiplies. Where a slice's rows continue the last
slice's, as a view of a projection's channels does (Sana's q), the slices are one.
"""
from __future__ import annotations

import triton
import triton.language as tl

from sgdiff.kernels.layout import contiguous_strides, like_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait, fresh_output
from sgdiff.kernels.triton.rows import DTYPES, cached_plan


@LeanKernel
@triton.jit
def _cast_copy_kernel(
    x_ptr, out_ptr,
    value,  # the padding
    N1: tl.constexpr,  # slices per batch entry
    I_IN: tl.constexpr, J_IN: tl.constexpr, I_OUT: tl.constexpr, J_OUT: tl.constexpr,  # the last 2 dims' sizes
    SX0: tl.constexpr, SX1: tl.constexpr, SX2: tl.constexpr, SX3: tl.constexpr,
    SO0: tl.constexpr, SO1: tl.constexpr, SO2: tl.constexpr, SO3: tl.constexpr,
    RELU: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    WIDE: tl.constexpr,  # offsets past 2**31: 64-bit arithmetic
):
    s = tl.program_id(2)  # (batch, head)
    if WIDE:
        s = s.to(tl.int64)
    s0, s1 = s // N1, s % N1
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    j = tl.program_id(0) * BLOCK_J + tl.arange(0, BLOCK_J)
    # i and j to 64 bits apart from s: converted together, ptxas scheduled Sana's q otherwise (5.75 -> 5.95 µs)
    if WIDE:
        i, j = i.to(tl.int64), j.to(tl.int64)
    src = x_ptr + s0 * SX0 + s1 * SX1 + i[:, None] * SX2 + j[None, :] * SX3
    dst = out_ptr + s0 * SO0 + s1 * SO1 + i[:, None] * SO2 + j[None, :] * SO3
    inside = (i < I_IN)[:, None] & (j < J_IN)[None, :]
    grid_dependency_wait()
    # no padding and tiles that fit: no mask (none is folded); else the grid, which covers the
    # output, reaches past the input
    if I_OUT == I_IN and J_OUT == J_IN and I_IN % BLOCK_I == 0 and J_IN % BLOCK_J == 0:
        v = tl.load(src)
    else:
        v = tl.load(src, mask=inside, other=0.0)
    v = v.to(tl.float32)  # exact; what the ReLU returns is v or 0, which x's dtype holds: no rounding back
    if RELU:
        v = relu_as_aten(v)
    if I_OUT > I_IN or J_OUT > J_IN:
        v = tl.where(inside, v, value)
    y = v.to(out_ptr.dtype.element_ty)
    if I_OUT % BLOCK_I == 0 and J_OUT % BLOCK_J == 0:
        tl.store(dst, y)
    else:
        tl.store(dst, y, mask=(i < I_OUT)[:, None] & (j < J_OUT)[None, :])


@triton.jit
def relu_as_aten(v):
    """ATen's ``relu`` (``clamp_min(v, 0)``) of fp32 ``v``: NaN passes with its bits, else the max."""
    return tl.where(v != v, v, tl.maximum(v, 0.0))


def supported_layout(x, dtype, relu, pad, value, contiguous) -> bool:
    """can_use without the device check: a 4-D float tensor, a float dtype, padding only after
    the last two dims' ends (as ``F.pad(v, (0, 0, 0, 1))``), and slices and row tiles that the
    grid's second and third axes hold (at most 65535 each)."""
    if not (x.dim() == 4 and x.dtype in DTYPES and dtype in DTYPES and x.numel() > 0 and len(pad) <= 4):
        return False
    pad = _pad4(pad)
    if not (all(p >= 0 for p in pad) and all(p == 0 for p in pad[0::2])):
        return False
    return x.shape[0] * x.shape[1] < 2 ** 16 and x.shape[2] + pad[3] < 2 ** 16


def _pad4(pad):
    """``F.pad``'s list for the last two dims, (left, right, top, bottom), zeros where absent."""
    return list(pad) + [0] * (4 - len(pad))


def can_use(x, dtype, relu, pad, value, contiguous) -> bool:
    return x.is_cuda and supported_layout(x, dtype, relu, pad, value, contiguous)


MERGED_ROWS = 64  # a tile's rows where heads are merged


def _merged_heads(x, shape, strides):
    """``x`` and its unpadded output as ``[B, 1, H * D, T]`` where in both a slice's rows continue
    the last slice's (``x``'s second stride is its third times D: Sana's q, a view of the
    projection's channels): one transpose of the projection's channels and the tokens
    rather than one per head, while its row tiles fit the grid's second axis. Otherwise None."""
    xs = x.stride()
    if xs[1] != xs[2] * x.shape[2] or strides[1] != strides[2] * shape[2]:
        return None
    if triton.cdiv(x.shape[1] * x.shape[2], MERGED_ROWS) >= 2 ** 16:
        return None
    merged = (x.shape[0], 1, x.shape[1] * x.shape[2], x.shape[3])
    return merged, (xs[0], 0, xs[2], xs[3]), merged, (strides[0], 0, strides[2], strides[3])


@cached_plan
def _plan(x, pad, contiguous):
    """``(shape, strides, grid, consts, num_warps)``: the output's geometry, and the launch."""
    pad = _pad4(pad)
    shape = (*x.shape[:2], x.shape[2] + pad[3], x.shape[3] + pad[1])
    strides = contiguous_strides(shape) if contiguous or any(pad) else like_strides(x)
    merged = None if any(pad) else _merged_heads(x, shape, strides)
    if merged is None:
        x_shape, x_strides, out_shape, out_strides = x.shape, x.stride(), shape, strides
        # the whole of a head's rows a tile, up to 64 (Sana's v padded to 33 rows: one 64-row tile rather
        # than 32 and a tile of one row), by 32 tokens: with the sizes compiled in, 32 x 32 and 64 x 32 (v)
        # tiles beat 32 x 128 and 64 x 64 (measured: bench/results/README.md)
        block_i, warps = min(64, triton.next_power_of_2(shape[2])), 4
    else:
        # heads merged, 64 rows by 32 tokens on 8 warps (against a head at a time, 4 warps and 128 x 16:
        # bench/results/README.md)
        x_shape, x_strides, out_shape, out_strides = merged
        block_i, warps = MERGED_ROWS, 8
    block_j = max(16, min(32, triton.next_power_of_2(shape[3])))
    # programs along the tokens first, then the rows, then the slices (Inductor's order for this
    # transpose)
    grid = (triton.cdiv(out_shape[3], block_j), triton.cdiv(out_shape[2], block_i), out_shape[0] * out_shape[1])
    reach = max(sum((n - 1) * st for n, st in zip(x.shape, x.stride())),
                sum((n - 1) * st for n, st in zip(shape, strides)))
    consts = dict(N1=x_shape[1], I_IN=x_shape[2], J_IN=x_shape[3], I_OUT=out_shape[2], J_OUT=out_shape[3],
                  **{f"SX{d}": st for d, st in enumerate(x_strides)}, **{f"SO{d}": st for d, st in enumerate(out_strides)},
                  BLOCK_I=block_i, BLOCK_J=block_j, WIDE=reach >= 2 ** 31)
    return shape, strides, grid, consts, warps


def bind(x, dtype, relu, pad, value, contiguous):
    """:func:`cast_copy` for inputs of this signature, its host arithmetic done. The shape and
    strides are compiled in (a kernel per geometry: a model has a few), so its index arithmetic
    is a handful of constant multiplies: at Sana's q, 208 -> 136 SASS instructions a 32 x 32 tile."""
    shape, strides, grid, consts, warps = _plan(x, tuple(pad), bool(contiguous))
    kernel = _cast_copy_kernel.bind(grid, RELU=bool(relu), **consts, num_warps=warps)
    return fresh_output(kernel, 1, shape, strides, dtype, float(value))


def cast_copy(x, dtype, relu, pad, value, contiguous):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, dtype, relu, pad, value, contiguous)(x)


CAST_COPY = Impl(run=cast_copy, supports=supported_layout, bind=bind)
