"""Triton sgdiff::upsample_nearest: a copy, each output element from ``x[n, c, i // 2, j // 2]``.

A program writes one output row's ``BLOCK_W`` positions for ``BLOCK_C`` channels: along the
row where the output is contiguous, along the channels where it is channels-last (the tile then
moves whole sectors both ways); the row's source row is one integer division a program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import channels_last_strides, flat_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES

TILE = 4096
GRID_LIMIT = 2 ** 16


@LeanKernel
@triton.jit
def _upsample_kernel(
    x_ptr, out_ptr,
    C, H, W, WB,  # WB: programs a row
    o_n, o_c, o_s,  # the output's [N, C, 2H * 2W] strides
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WIDE: tl.constexpr,
):
    row = tl.program_id(0) // WB
    j = (tl.program_id(0) % WB) * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]
    n = tl.program_id(2)
    if WIDE:
        row = row.to(tl.int64)
        c = c.to(tl.int64)
        n = n.to(tl.int64)
    inside = (c < C) & (j < 2 * W)
    grid_dependency_wait()
    v = tl.load(x_ptr + ((n * C + c) * H + row // 2) * W + j // 2, mask=inside)
    tl.store(out_ptr + n * o_n + c * o_c + (row * 2 * W + j) * o_s, v, mask=inside)


def supported_layout(x, output_size, scales_h=None, scales_w=None, channels_last=False) -> bool:
    """Everything but the device: a contiguous [N, C, H, W] float map doubled in both dims (ATen's
    source index is then ``i // 2`` whatever the scales, which must be None or 2)."""
    return (x.dim() == 4 and x.dtype in DTYPES and x.is_contiguous() and x.numel() > 0
            and list(output_size) == [2 * x.shape[2], 2 * x.shape[3]]
            and all(s is None or s == 2.0 for s in (scales_h, scales_w))
            and x.shape[0] < GRID_LIMIT and triton.cdiv(x.shape[1], _block_c(x.shape[1])) < GRID_LIMIT)


def _block_c(c: int) -> int:
    return min(64, triton.next_power_of_2(c))


def bind(x, output_size, scales_h=None, scales_w=None, channels_last=False):
    """:func:`upsample_nearest` for inputs of this signature, its host arithmetic done."""
    n, c, h, w = x.shape
    shape = (n, c, 2 * h, 2 * w)
    strides = channels_last_strides(shape) if channels_last else tuple(torch.empty(shape, device="meta").stride())
    block_c = _block_c(c)
    block_w = max(16, min(TILE // block_c, triton.next_power_of_2(2 * w)))
    wb = triton.cdiv(2 * w, block_w)
    kernel = _upsample_kernel.bind((2 * h * wb, triton.cdiv(c, block_c), n), BLOCK_C=block_c, BLOCK_W=block_w,
                                   WIDE=4 * x.numel() >= 2 ** 31, num_warps=4)
    o = flat_strides(shape, strides)

    def launch(x, *_):
        out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
        kernel(x, out, c, h, w, wb, *o)
        return out

    return launch


def upsample_nearest(*args):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(*args)(*args)


UPSAMPLE_NEAREST = Impl(run=upsample_nearest, supports=supported_layout, bind=bind)
