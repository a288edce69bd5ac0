"""Triton sgdiff::cat_pad: a constant pad of a two-tensor ``cat`` (or of one tensor), written in
one pass.

A copy: every output element is an element of ``a`` or ``b`` or the pad value (rounded to the
dtype on the host, as ATen's ``fill_`` rounds it), so the bits are eager's by construction.
Up to 5 dims (fewer are read as 5 with leading ones), inputs of any strides; the output is
contiguous (the pattern takes sites where ATen's is). A program covers ``BLOCK_R`` rows (the
output's first four dims, flattened) and ``BLOCK_W`` elements of its last dim. Each row maps back
to a row of the cat (its coordinates less the pad before them) and so to a row of ``a`` or of
``b``, once a row; an element then costs one load (two, masked, where the cat is along the last
dim). Rows are as wide as a program allows (up to 1024 elements), so a video frame's row is one
block and the row arithmetic is spread over many elements.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan, row_index

RANK = 5
BLOCK = 2048  # elements a program (H200: 4096 and 8192 were slower at every Wan shape)
MAX_W = 1024  # the widest block along the last dim
WARPS = 4


@triton.jit
def _row_offsets(k0, k1, k2, k3, s0, s1, s2, s3):
    """Element offsets of rows at coordinates ``k`` (the first four dims) of a tensor of strides
    ``s``, in 64 bits."""
    return k0.to(tl.int64) * s0 + k1.to(tl.int64) * s1 + k2.to(tl.int64) * s2 + k3.to(tl.int64) * s3


@LeanKernel
@triton.jit
def _cat_pad_kernel(
    a_ptr, b_ptr, out_ptr, value,
    n_rows, O1, O2, O3, O4,  # the output's sizes (dim 0's implied by n_rows)
    P0, P1, P2, P3, P4,  # the pad before each dim (negative: cropped)
    I0, I1, I2, I3, I4,  # the cat's sizes
    sa0, sa1, sa2, sa3, sa4,  # a's strides
    sb0, sb1, sb2, sb3, sb4,  # b's strides
    SPLIT,  # a's size along DIM
    DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    lead, c2, c3 = row_index(rows, O2, O3)
    # the cat's coordinates of each output row (a vector over rows: per-row arithmetic is done
    # once a row, not once an element)
    k0 = lead // O1 - P0
    k1 = lead % O1 - P1
    k2 = c2 - P2
    k3 = c3 - P3
    k4 = w - P4
    row_inside = (rows < n_rows) & (k0 >= 0) & (k0 < I0) & (k1 >= 0) & (k1 < I1) & (k2 >= 0) & (k2 < I2) \
        & (k3 >= 0) & (k3 < I3)
    inside = row_inside[:, None] & ((k4 >= 0) & (k4 < I4))[None, :]
    out_ok = (rows < n_rows)[:, None] & (w < O4)[None, :]
    fill = tl.full([BLOCK_R, BLOCK_W], value, out_ptr.dtype.element_ty)  # exact: the host rounded it
    off_a = _row_offsets(k0, k1, k2, k3, sa0, sa1, sa2, sa3)
    grid_dependency_wait()
    if DIM == 4:  # the cat along the last dim: a or b per element, two masked loads
        in_a = (k4 < SPLIT)[None, :]
        col = k4.to(tl.int64)[None, :]
        from_a = tl.load(a_ptr + (off_a[:, None] + col * sa4), mask=inside & in_a, other=0.0)
        from_b = tl.load(b_ptr + (_row_offsets(k0, k1, k2, k3, sb0, sb1, sb2, sb3)[:, None] + (col - SPLIT) * sb4),
                         mask=inside & (~in_a), other=0.0)
        y = tl.where(inside, tl.where(in_a, from_a, from_b), fill)
    else:  # a or b per row: one pointer a row, one load an element
        if DIM == 0:
            in_a = k0 < SPLIT
            off_b = _row_offsets(k0 - SPLIT, k1, k2, k3, sb0, sb1, sb2, sb3)
        elif DIM == 1:
            in_a = k1 < SPLIT
            off_b = _row_offsets(k0, k1 - SPLIT, k2, k3, sb0, sb1, sb2, sb3)
        elif DIM == 2:
            in_a = k2 < SPLIT
            off_b = _row_offsets(k0, k1, k2 - SPLIT, k3, sb0, sb1, sb2, sb3)
        else:
            in_a = k3 < SPLIT
            off_b = _row_offsets(k0, k1, k2, k3 - SPLIT, sb0, sb1, sb2, sb3)
        row = tl.where(in_a, a_ptr + off_a, b_ptr + off_b)
        step = tl.where(in_a, sa4, sb4).to(tl.int64)
        y = tl.load(row[:, None] + k4.to(tl.int64)[None, :] * step[:, None], mask=inside, other=0.0)
        y = tl.where(inside, y, fill)
    o = out_ptr + rows.to(tl.int64)[:, None] * O4 + w[None, :]
    tl.store(o, y, mask=out_ok)


def _geometry(a, b, dim: int, pad: Sequence[int]):
    """The 5-D ``(cat sizes, pad before, output sizes, dim)`` of ``constant_pad_nd(cat([a, b],
    dim), pad)`` (of ``a`` alone where ``b`` is None), or None where it is not one this kernel
    writes."""
    rank = a.dim()
    if not (1 <= rank <= RANK and (b is None or b.dim() == rank) and len(pad) % 2 == 0 and len(pad) // 2 <= rank):
        return None
    dim = dim % rank
    cat = list(a.shape)
    if b is not None:
        if any(a.shape[d] != b.shape[d] for d in range(rank) if d != dim):
            return None
        cat[dim] += b.shape[dim]
    before, after = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        before[rank - 1 - i], after[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    out = [c + p + q for c, p, q in zip(cat, before, after)]
    lead = RANK - rank
    return [1] * lead + cat, [0] * lead + before, [1] * lead + out, dim + lead


def supported_layout(a, b, dim, pad, value) -> bool:
    """can_use without the device check: ``a`` and ``b`` floats of one dtype and device (any
    strides), sizes equal but along ``dim``, up to 5 dims, the output not empty and its rows
    counted in 32 bits."""
    if not (a.dtype in DTYPES and (b is None or (b.dtype == a.dtype and b.device == a.device))
            and isinstance(dim, int) and all(isinstance(p, int) for p in pad)):
        return False
    geometry = _geometry(a, b, dim, pad)
    if geometry is None:
        return False
    out = geometry[2]
    numel = 1
    for size in out:
        numel *= size
    return min(out) > 0 and numel // out[-1] < 2**31 and max(geometry[0]) < 2**31


def can_use(a, b, dim, pad, value) -> bool:
    return a.is_cuda and supported_layout(a, b, dim, pad, value)


@cached_plan
def _plan(a, b, dim, pad):
    cat, before, out, dim5 = _geometry(a, b, dim, tuple(pad))
    n_rows = out[0] * out[1] * out[2] * out[3]
    block_w = min(triton.next_power_of_2(out[4]), MAX_W)  # a frame's row in one block, if it is
    block_r = max(1, min(triton.next_power_of_2(n_rows), BLOCK // block_w))  # narrower than MAX_W
    grid = (triton.cdiv(n_rows, block_r), triton.cdiv(out[4], block_w))
    lead = (0,) * (RANK - a.dim())  # leading dims of size 1: any stride
    b_strides = a.stride() if b is None else b.stride()  # without b, every element is a's
    ints = (n_rows, *out[1:], *before, *cat, *lead, *a.stride(), *lead, *b_strides, a.shape[dim % a.dim()])
    return tuple(out[RANK - a.dim():]), grid, ints, dict(DIM=dim5, BLOCK_R=block_r, BLOCK_W=block_w)


def bind(a, b, dim, pad, value):
    """:func:`cat_pad` for inputs of this signature, its host arithmetic done."""
    out_shape, grid, ints, blocks = _plan(a, b, dim, tuple(pad))
    kernel = _cat_pad_kernel.bind(grid, **blocks, num_warps=WARPS)
    fill = float(torch.tensor(value, dtype=a.dtype))  # ATen's fill_ rounds the value to the dtype

    def launch(a, b, *_):
        out = torch.empty(out_shape, dtype=a.dtype, device=a.device)
        kernel(a, a if b is None else b, out, fill, *ints)
        return out

    return launch


def cat_pad(a, b, dim, pad, value):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(a, b, dim, pad, value)(a, b)


CAT_PAD = Impl(run=cat_pad, supports=supported_layout, bind=bind)
