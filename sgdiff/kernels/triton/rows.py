"""Row addressing shared by the row-wise Triton kernels (RoPE, RMSNorm, modulation, gates).

A kernel sees every operand as a 4-D tensor ``[n0, n1, n2, D]`` (leading dims padded with 1)
read through its own strides, broadcast operands with stride 0, so views (transposes, chunks
of a projection, ``[:, None]`` rows) need no copy. A program handles ``BLOCK_R`` rows of ``D``.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence, Tuple

import torch
import triton
import triton.language as tl

LANES = 32  # a warp
DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the kernels read and write
TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def rows_fit(t: torch.Tensor, row_len: int) -> bool:
    """Whether ``t``'s rows of ``row_len`` elements can be counted in 32 bits (:func:`row_offsets`);
    elementwise kernels, whose rows are any dim, pass 1."""
    return t.numel() // max(row_len, 1) < 2**31


class Geometry(NamedTuple):
    """What a launch plan may depend on of a tensor: shape, strides, dtype (never data)."""
    shape: tuple
    stride: tuple
    dtype: torch.dtype


def cached_plan(plan: Callable) -> Callable:
    """Memoize a launcher's host-side arithmetic (grid, strides, block sizes) per input geometry.

    ``plan`` is called with meta tensors standing for the tensor arguments (and the other
    arguments as they are) once per geometry; later calls with tensors of that geometry cost a
    lookup, which keeps a launch's host time near Triton's own.
    """
    @functools.lru_cache(maxsize=4096)
    def from_geometry(*key):
        return plan(*(torch.empty_strided(k.shape, k.stride, dtype=k.dtype, device="meta")
                      if isinstance(k, Geometry) else k for k in key))

    @functools.wraps(plan)
    def lookup(*args):
        return from_geometry(*(Geometry(a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                               for a in args))

    return lookup


def shape4(shape: Sequence[int]) -> Tuple[int, int, int, int]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def strides4(t: torch.Tensor, shape: Sequence[int]) -> Tuple[int, ...]:
    """Strides of ``t`` broadcast to ``shape`` (any rank up to 4), padded to 4 dims."""
    strides = t.expand(tuple(shape)).stride()
    return (0,) * (4 - len(strides)) + tuple(strides)


def launch_rows(n_rows: int, d: int, max_block: int = 4096, max_d: int = 1024, flat: bool = False):
    """``(grid, BLOCK_R, BLOCK_D)`` for elementwise kernels: about ``max_block`` elements per
    program, rows on grid axis 0 and column blocks on axis 1, or with ``flat`` both on axis 0,
    column blocks fastest (:func:`row_tile`). BLOCK_D is the widest power of two up to
    ``max_d`` whose column blocks overrun ``d`` by at most 1/16 (Sana's 5600 channels: 512, not
    1024 with a last block half empty)."""
    block_d = min(triton.next_power_of_2(d), max_d)
    while block_d > 128 and triton.cdiv(d, block_d) * block_d * 16 > d * 17:
        block_d //= 2
    block_r = max(1, min(triton.next_power_of_2(n_rows), max_block // block_d))
    blocks = (triton.cdiv(n_rows, block_r), triton.cdiv(d, block_d))
    return ((blocks[0] * blocks[1],) if flat else blocks), block_r, block_d


@triton.jit
def row_index(rows, n1, n2):
    """The indices ``(i0, i1, i2)`` of rows ``rows`` (row-major over ``[n0, n1, n2]``).

    Split in 32 bits (a 64-bit division is a long software sequence, per row of every operand;
    launchers keep row counts below 2**31: :func:`rows_fit`). ``n1``/``n2`` of 1 are
    specialized by Triton and their divisions vanish."""
    r = rows.to(tl.int32)
    rest = r // n2
    return rest // n1, rest % n1, r % n2


@triton.jit
def row_offsets(rows, n1, n2, s0, s1, s2):
    """Element offsets of rows ``rows`` (row-major over ``[n0, n1, n2]``) of a 4-D operand,
    summed in 64 bits."""
    i0, i1, i2 = row_index(rows, n1, n2)
    return i0.to(tl.int64) * s0 + i1.to(tl.int64) * s1 + i2.to(tl.int64) * s2


@triton.jit
def row_tile(n_rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FLAT: tl.constexpr, EVEN: tl.constexpr = False):
    """This program's rows (32-bit: :func:`rows_fit`) and columns of a [n_rows, D] elementwise
    launch (:func:`launch_rows`), and the mask of those inside it. ``FLAT``: one grid axis,
    consecutive programs along a row's column blocks, so that they walk memory in order (which
    pays on long rows: silu_mul's and residual_gate's notes); otherwise rows on axis 0 and
    column blocks on axis 1, consecutive programs down a column of row blocks. ``EVEN``: the
    blocks tile [n_rows, D] exactly (:func:`even_tiles`); the mask is then a constant that
    Triton folds away, and loads and stores go unpredicated (a masked load zeroes its
    registers first, an instruction a load)."""
    if FLAT:
        col_blocks = tl.cdiv(D, BLOCK_D)
        row_block = tl.program_id(0) // col_blocks
        col_block = tl.program_id(0) - row_block * col_blocks
    else:
        row_block = tl.program_id(0)
        col_block = tl.program_id(1)
    rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)
    d = col_block * BLOCK_D + tl.arange(0, BLOCK_D)
    if EVEN:
        return rows, d, tl.full([BLOCK_R, BLOCK_D], 1, tl.int1)
    return rows, d, (rows < n_rows)[:, None] & (d < D)[None, :]


def even_tiles(n_rows: int, d: int, block_r: int, block_d: int) -> bool:
    """Whether ``[block_r, block_d]`` blocks tile ``[n_rows, d]`` exactly (row_tile's EVEN)."""
    return n_rows % block_r == 0 and d % block_d == 0


@triton.jit
def tile_offsets(rows, d, n1, n2, s0, s1, s2, s3):
    """Element offsets of the [rows, d] tile of a 4-D operand (rows row-major over its first 3 dims,
    ``d`` along the last)."""
    return row_offsets(rows, n1, n2, s0, s1, s2)[:, None] + d[None, :] * s3


@triton.jit
def halves(t):
    """The first and second halves of the last axis of a [R, W] tile, as [R, W/2] tiles."""
    return tl.split(tl.permute(tl.reshape(t, (t.shape[0], 2, t.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def halving_sum(v, LEVELS: tl.constexpr):
    """Sum each row of a [R, 2**LEVELS] tile the way a CUDA shuffle-down (or shared-memory)
    tree does: ``for offset in W/2, W/4, ..., 1: v[i] += v[i + offset]``, then ``v[0]``.

    Each level is a sum over an axis of size 2, ``v[i] + v[i + W/2]``: one addition, exact
    whatever layout Triton picks (``tl.sum`` over more elements has a layout-dependent order),
    and with no register shuffling between levels."""
    R: tl.constexpr = v.shape[0]
    for level in tl.static_range(LEVELS):
        v = tl.sum(tl.reshape(v, (R, 2, v.shape[1] // 2)), axis=1)
    return tl.reshape(v, (R,))


def innermost_last(out: torch.Tensor, *operands: torch.Tensor):
    """For elementwise kernels: ``out`` and the operands (broadcast to ``out``'s shape) with
    their dims permuted so that ``out``'s innermost dim comes last, at most 4 dims. Returns
    ``(shape4, [strides4 of out, then of each operand])``; channels-last and transposed
    outputs then run along rows like contiguous ones.

    Leading dims that every tensor steps through as one (a contiguous ``[B, H, W]`` of rows,
    Sana's channels-last pixels) merge into one, and padding dims go after the leading ones,
    ``[n0, 1, 1, D]``: row indices then need no division (:func:`row_offsets`)."""
    order = sorted(range(out.dim()), key=lambda d: (-out.stride(d), d))
    full = [t.expand(out.shape).stride() for t in (out, *operands)]
    return merge_rows([out.shape[d] for d in order], [[st[d] for d in order] for st in full])


def merge_rows(shape: Sequence[int], strides: Sequence[Sequence[int]]):
    """``(shape4, [strides4, ...])`` of tensors of one ``shape`` (at most 4 dims) whose leading
    dims every tensor steps through as one (a contiguous ``[B, S, H]`` of rows) merged into
    one, padding dims after the leading ones, ``[n0, 1, 1, D]``: row indices then need no
    division (:func:`row_offsets`). The last dim (the kernels' D) is kept as it is."""
    shape, strides = list(shape), [list(st) for st in strides]
    for i in reversed(range(len(shape) - 2)):
        if all(st[i] == st[i + 1] * shape[i + 1] for st in strides):
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
            for st in strides:
                st[i:i + 2] = [st[i + 1]]
    pad = 4 - len(shape)
    shape4_ = tuple(shape[:-1]) + (1,) * pad + (shape[-1],)
    return shape4_, [tuple(st[:-1]) + (0,) * pad + (st[-1],) for st in strides]
