"""A convolution epilogue between layouts: ``out = ((y + bias) [+ residual]) [* inv]``, each
tensor [N, C, *spatial] read and written through its own strides.

Where sgdiff feeds a convolution channels-last input (:mod:`sgdiff.fxpasses.layouts`), cuDNN
writes its output channels-last too, while the eager chain after it computed on a contiguous
one. This pass reads the bias-free output ``y`` in its layout, adds the bias (``add_``'s
rounding, as :mod:`sgdiff.kernels.triton.conv_bias` describes), then the residual (the sum's
rounding) and the division's reciprocal product, and writes the result in the layout eager's
chain gave it: the transpose back to contiguous that cuDNN would have run after an NCHW
convolution costs nothing here, being this pass's own write. A program takes a tile of
``BLOCK_C`` channels by ``BLOCK_S`` positions, so that both a channels-last read (channels
adjacent) and a contiguous write (positions adjacent) move whole sectors.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import contiguous_strides, flat_strides
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.residual_gate import reciprocal, scales

TILE = 4096  # elements a program
GRID_LIMIT = 2 ** 16  # CUDA's limit on a grid's second and third dimensions


@triton.jit
def channel_tile(C, S, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, WIDE: tl.constexpr):
    """This program's tile of an [N, C, S] map: ``(n, c [BLOCK_C, 1], s [1, BLOCK_S], inside)``,
    the grid being (S tiles, C tiles, N); int64 indices where WIDE."""
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)[None, :]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]
    n = tl.program_id(2)
    if WIDE:
        s = s.to(tl.int64)
        c = c.to(tl.int64)
        n = n.to(tl.int64)
    return n, c, s, (c < C) & (s < S)


@LeanKernel
@triton.jit
def _strided_epilogue_kernel(
    y_ptr, b_ptr, r_ptr, out_ptr,
    C, S, inv,
    y_n, y_c, y_s, r_n, r_c, r_s, o_n, o_c, o_s,  # [N, C, S] strides of y, the residual, out
    RESIDUAL: tl.constexpr,
    DIVIDE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WIDE: tl.constexpr,
):
    n, c, s, inside = channel_tile(C, S, BLOCK_C, BLOCK_S, WIDE)
    grid_dependency_wait()
    y = tl.load(y_ptr + n * y_n + c * y_c + s * y_s, mask=inside, other=0.0)
    h = (y.to(tl.float32) + tl.load(b_ptr + c, mask=c < C, other=0.0).to(tl.float32)).to(y.dtype)
    if RESIDUAL:
        r = tl.load(r_ptr + n * r_n + c * r_c + s * r_s, mask=inside, other=0.0)
        h = (r.to(tl.float32) + h.to(tl.float32)).to(y.dtype)
    if DIVIDE:
        h = (h.to(tl.float32) * inv).to(y.dtype)
    tl.store(out_ptr + n * o_n + c * o_c + s * o_s, h, mask=inside)


def eager_strides(shape: Sequence[int], residual: Optional[torch.Tensor], conv_first: bool = False) -> tuple:
    """The strides of the eager chain's output: a contiguous convolution output, or its sum with
    ``residual`` as TensorIterator lays it out (operand order matters where layouts differ)."""
    if residual is None:
        return tuple(contiguous_strides(shape))
    y = torch.empty(shape, dtype=torch.float32, device="meta")
    r = torch.empty_strided(residual.shape, residual.stride(), dtype=torch.float32, device="meta")
    return tuple((y + r if conv_first else r + y).stride())


def fits(shape: Sequence[int], *strides: Sequence[int]) -> bool:
    """Whether the kernel takes tensors of this shape and these strides."""
    c = shape[1]
    block_c = min(64, triton.next_power_of_2(c))
    return (len(shape) >= 3 and all(flat_strides(shape, st) is not None for st in strides)
            and shape[0] < GRID_LIMIT and triton.cdiv(c, block_c) < GRID_LIMIT)


def _reach(shape: Sequence[int], strides: Sequence[int]) -> int:
    """One past the farthest element's offset from the tensor's first."""
    return sum((size - 1) * stride for size, stride in zip(shape, strides)) + 1


def bind(y: torch.Tensor, residual: Optional[torch.Tensor], divisor: Optional[float], out_strides: Sequence[int]):
    """``epilogue(y, bias, residual) -> out`` for inputs of this signature, ``out`` fresh with
    ``out_strides`` (where those are ``y``'s, ``y`` itself is written over)."""
    shape, n, c = tuple(y.shape), y.shape[0], y.shape[1]
    s = y.numel() // max(n * c, 1)
    inv = reciprocal(divisor) if divisor is not None else 1.0
    block_c = min(64, triton.next_power_of_2(c))
    block_s = max(16, min(TILE // block_c, triton.next_power_of_2(s)))
    r_strides = flat_strides(shape, residual.stride()) if residual is not None else (0, 0, 0)
    y_strides, o_strides = flat_strides(shape, y.stride()), flat_strides(shape, out_strides)
    read = [y.stride(), out_strides] + ([residual.stride()] if residual is not None else [])
    reach = max(_reach(shape, st) for st in read)
    kernel = _strided_epilogue_kernel.bind((triton.cdiv(s, block_s), triton.cdiv(c, block_c), n),
                                           RESIDUAL=residual is not None, DIVIDE=scales(inv), BLOCK_C=block_c,
                                           BLOCK_S=block_s, WIDE=reach >= 2 ** 31, num_warps=4,
                                           enable_fp_fusion=False)
    in_place = tuple(out_strides) == tuple(y.stride())

    def epilogue(y, bias, residual=None):
        out = y if in_place else torch.empty_strided(shape, out_strides, dtype=y.dtype, device=y.device)
        kernel(y, bias, residual if residual is not None else y, out, c, s, inv, *y_strides, *r_strides, *o_strides)
        return out

    return epilogue
