"""Triton sgdiff::rms_norm, bitwise equal to eager on CUDA: the diffusers and fused forms.

**diffusers** form: diffusers' RMSNorm is a chain of ATen kernels; the only one with an order to
reproduce is the mean, ATen's generic reduction (aten/src/ATen/native/cuda/Reduce.cuh)::

    sq   = fp32(x) * fp32(x)                      # pow(2), rounded to fp32
    mean = sum(sq) * factor                       # factor = fp32(M) / fp32(M * N), M rows
    r    = rsqrtf(mean + eps)                     # rsqrt.approx.f32
    y    = fp32(x) * r                            # rounded to fp32
    y    = y.to(w.dtype) * w  (fp16/bf16 w),  y * w  (fp32 w),  y.to(x.dtype)  (no w)

The sum: a warp (32 lanes) per row. For N >= 128 ATen loads 4-vectors: lane ``l`` keeps four
accumulators, ``acc[i] += sq[4 (l + 32 k) + i]`` for k = 0, 1, ...; the kernel gives a row a
warp too, reads each 128-element chunk once as a [R, 32, 4] tile (lane l's vector l), and
keeps the chunks for the output (N compiled in: only a partial last chunk is masked; rows of
128 are one [R, 128] tile, reshaped for the sum, which measured faster per head). A long row's
outputs are all computed before the first store, so that the weight, scale and shift loads
need not wait behind stores that may alias them. For
32 <= N < 128 ATen loads single elements, ``acc[i] = sq[l + 32 i]``, which the kernel reads
as one [R, 32] slice per accumulator. Each lane then folds
``((acc0 + acc1) + acc2) + acc3`` and the warp folds lanes by shuffle-down with offsets 16, 8,
4, 2, 1 (:func:`sgdiff.kernels.triton.rows.halving_sum`). Few rows make ATen widen the block;
those inputs are left to the chain.

**fused** form: ``aten::_fused_rms_norm`` (F.rms_norm / torch.nn.RMSNorm on CUDA), ATen's
vectorized LayerNorm kernel with ``rms_norm=true`` (layer_norm_kernel.cu): 128 threads per
row, thread ``t`` reading 4-vectors ``t, t + 128, ...``::

    acc  = fma(x, x, acc)                         # per thread, elements in order
    sum  = per-warp shuffle-down tree, then warps (0 + 2) + (1 + 3)
    var  = sum / N                                # IEEE division
    r    = rsqrtf(var + eps)                      # eps None: FLT_EPSILON
    y    = w * (r * x)  or  r * x                 # fp32, rounded once to x.dtype

It is taken when N % 4 == 0 and x (after ``.contiguous()``) and w are 4-vector aligned; other
inputs run ATen's Welford fallback and are left to the chain.

Either kernel also serves sgdiff::rmsnorm_modulate (``MODULATE``): each row, rounded to the
norm's dtype, is modulated as eager's ``y * (1 + scale) + shift`` rounds it
(:func:`.modulate.modulated`) before it is stored, so the norm's output never reaches memory.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import like_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, rsqrtf
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.modulate import modulated, out_dtypes
from sgdiff.kernels.triton.rows import (
    DTYPES,
    LANES,
    TL_DTYPE,
    cached_plan,
    halving_sum,
    merge_rows,
    row_offsets,
    rows_fit,
    shape4,
    strides4,
)
from sgdiff.kernels.triton.welford import aligned_vec4, unpack4

_HALF = (torch.float16, torch.bfloat16)
MAX_N = 16384
FLT_EPSILON = 2.0 ** -23  # eps=None in _fused_rms_norm
VECTORIZE_MIN = 128  # Reduce.cuh: "dim0 >= 128" vectorizes the input
MAX_THREADS = 512  # Reduce.cuh: max_reduce_threads for fp32


@triton.jit
def _squares(x_row, cols, row_ok, N, sx3):
    """fp32 squares of columns ``cols`` of a [R, N] tile (0 past the end)."""
    v = tl.load(x_row + cols[None, :] * sx3, mask=row_ok[:, None] & (cols < N)[None, :], other=0.0)
    v = v.to(tl.float32)
    return v * v


@LeanKernel
@triton.jit
def _rms_norm_diffusers_kernel(
    x_ptr, w_ptr, out_ptr,
    n_rows, n1, n2,
    sx0, sx1, sx2, sx3,
    so0, so1, so2, so3,
    eps, factor,
    sc_ptr, sh_ptr,  # a modulation's scale and shift (unused unless MODULATE)
    N: tl.constexpr,  # the row's length, compiled in: only a row's last, partial chunk is masked
    VECTORIZED: tl.constexpr,  # N >= 128: ATen's 4-vector loads
    ITERS: tl.constexpr,  # vectors per lane, ceil(N / 128); elements per lane, ceil(N / 32), if not VECTORIZED
    HAS_WEIGHT: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,  # y is rounded to this before the weight (w.dtype if half)
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRET: tl.constexpr,
    MODULATE: tl.constexpr = (),  # (): none; else modulation(...): the output modulated as eager's chain
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    o_row = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None]
    grid_dependency_wait()
    if VECTORIZED and ITERS > 1:  # lane l, accumulator i: element 4 (l + 32 k) + i of the row
        # the row's 128-element chunks as [R, 32, 4] tiles (lane l's 4-vector l), each loaded once:
        # squared for the mean, kept for the output
        chunk = tl.arange(0, 32)[:, None] * 4 + tl.arange(0, 4)[None, :]
        x_row, o_row = x_row[:, :, None], o_row[:, :, None]
        xs = ()
        for k in tl.static_range(ITERS):
            col = chunk + k * 128
            v = tl.load(x_row + col[None] * sx3, mask=_chunk_mask(row_ok, col, k, N), other=0.0).to(tl.float32)
            xs = xs + (v,)
            s0, s1, s2, s3 = unpack4(v * v)
            if k == 0:
                acc0, acc1, acc2, acc3 = s0, s1, s2, s3
            else:
                acc0, acc1, acc2, acc3 = acc0 + s0, acc1 + s1, acc2 + s2, acc3 + s3
        lanes = ((acc0 + acc1) + acc2) + acc3
        r = rsqrtf(halving_sum(lanes, 5) * factor + eps, INTERPRET)
        # every chunk's output before any store: a store may alias the weight, scale or shift, so
        # their loads cannot move past it, and each chunk would wait out its own loads' latency
        ys = ()
        for k in tl.static_range(ITERS):
            col = chunk + k * 128
            y = _rms_norm_output(xs[k] * r[:, None, None], w_ptr, sc_ptr, sh_ptr, rows, col,
                                 _chunk_mask(row_ok, col, k, N), n1, n2, N, HAS_WEIGHT, ROUND_DTYPE, MODULATE)
            ys = ys + (y.to(out_ptr.dtype.element_ty),)
        for k in tl.static_range(ITERS):
            col = chunk + k * 128
            tl.store(o_row + col[None] * so3, ys[k], mask=_chunk_mask(row_ok, col, k, N))
    else:  # the row one [R, BLOCK_N] tile
        d = tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (d < N)[None, :]
        x = tl.load(x_row + d[None, :] * sx3, mask=mask, other=0.0).to(tl.float32)
        if VECTORIZED:  # N == 128: the tile is the chunk, reshaped to lane l's 4-vector l
            acc0, acc1, acc2, acc3 = unpack4(tl.reshape(x * x, (BLOCK_R, 32, 4)))
            lanes = ((acc0 + acc1) + acc2) + acc3
        else:  # lane l, accumulator i: element l + 32 i, one [R, 32] slice per accumulator
            lane = tl.arange(0, 32)
            lanes = _squares(x_row, lane, row_ok, N, sx3)
            for i in tl.static_range(1, ITERS):
                lanes = lanes + _squares(x_row, lane + 32 * i, row_ok, N, sx3)
        r = rsqrtf(halving_sum(lanes, 5) * factor + eps, INTERPRET)
        y = _rms_norm_output(x * r[:, None], w_ptr, sc_ptr, sh_ptr, rows, d, mask, n1, n2, N,
                             HAS_WEIGHT, ROUND_DTYPE, MODULATE)
        tl.store(o_row + d[None, :] * so3, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_mask(row_ok, col, k: tl.constexpr, N: tl.constexpr):
    """The mask of chunk ``k``'s [R, 32, 4] tile: rows only where the chunk is whole (a column
    mask would cost its loads and stores their vectors), rows and columns in a partial last one."""
    if (k + 1) * 128 <= N:
        mask = row_ok[:, None, None]
    else:
        mask = row_ok[:, None, None] & (col < N)[None]
    return mask


@triton.jit
def _rms_norm_output(y, w_ptr, sc_ptr, sh_ptr, rows, cols, mask, n1, n2, N, HAS_WEIGHT: tl.constexpr,
                     ROUND_DTYPE: tl.constexpr, MODULATE: tl.constexpr):
    """The diffusers form's output at ``cols`` from ``y = x * r`` (fp32): through the weight
    (``y`` rounded to ROUND_DTYPE first, as diffusers casts it), then modulated where MODULATE."""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = y.to(ROUND_DTYPE).to(tl.float32) * w[None]
    if len(MODULATE) > 0:
        y = _modulate_rows(y, sc_ptr, sh_ptr, rows, cols, mask, n1, n2, MODULATE)
    return y


@triton.jit
def _modulate_rows(y, sc_ptr, sh_ptr, rows, cols, mask, n1, n2, MODULATE: tl.constexpr):
    """The norm's fp32 output ``y`` at ``rows`` x ``cols`` rounded to its dtype, then modulated as
    eager modulates it (:func:`modulation`: its dtypes and the operands' strides, compiled in)."""
    NORM_DTYPE: tl.constexpr = MODULATE[0]
    PRODUCT_DTYPE: tl.constexpr = MODULATE[1]
    SC: tl.constexpr = MODULATE[2]
    SH: tl.constexpr = MODULATE[3]
    sc = tl.load(sc_ptr + _at(row_offsets(rows, n1, n2, SC[0], SC[1], SC[2]), cols * SC[3]), mask=mask, other=0.0)
    sh = None
    if len(SH) > 0:
        sh = tl.load(sh_ptr + _at(row_offsets(rows, n1, n2, SH[0], SH[1], SH[2]), cols * SH[3]), mask=mask,
                     other=0.0)
    return modulated(y.to(NORM_DTYPE), sc, sh, PRODUCT_DTYPE)


@triton.jit
def _at(row_off, col_off):
    """Offsets of a [R, *cols] tile: each row's offset plus each column's ([C] or [32, 4] columns)."""
    if len(col_off.shape) == 1:  # one return: Triton types every return of a function alike
        off = row_off[:, None] + col_off[None, :]
    else:
        off = row_off[:, None, None] + col_off[None]
    return off


def modulation(norm_dtype, product_dtype, sc_strides, sh_strides) -> tuple:
    """The rms_norm kernels' MODULATE: a hashable description, compiled in."""
    return (TL_DTYPE[norm_dtype], TL_DTYPE[product_dtype], tuple(sc_strides), tuple(sh_strides or ()))


@triton.jit
def fused_sum_squares(acc, v):
    """Fold a [R, 4 * T] tile into the [R, T] per-thread accumulators of ATen's fused RMSNorm:
    thread t takes its 4-vector (columns 4t .. 4t + 3) with ``acc = fma(x, x, acc)`` in order."""
    x0, x1, x2, x3 = unpack4(tl.reshape(v.to(tl.float32), (acc.shape[0], acc.shape[1], 4)))
    acc = tl.fma(x0, x0, acc)
    acc = tl.fma(x1, x1, acc)
    acc = tl.fma(x2, x2, acc)
    return tl.fma(x3, x3, acc)


@triton.jit
def fused_inv_rms(acc, N, eps, INTERPRET: tl.constexpr):
    """``rsqrtf(sum / N + eps)`` per row from [R, T] thread accumulators (T = 32 or 128):
    each warp's shuffle-down tree, then warps (0 + 2) + (1 + 3), then an IEEE division."""
    R: tl.constexpr = acc.shape[0]
    T: tl.constexpr = acc.shape[1]
    total = halving_sum(tl.reshape(acc, (R * (T // 32), 32)), 5)
    if T == 128:
        total = halving_sum(tl.reshape(total, (R, 4)), 2)
    var = tl.math.div_rn(total, tl.full(total.shape, N, tl.float32))
    return rsqrtf(var + eps, INTERPRET)


@LeanKernel
@triton.jit
def _rms_norm_fused_kernel(
    x_ptr, w_ptr, out_ptr,
    n_rows, n1, n2, N,
    sx0, sx1, sx2,
    so0, so1, so2,
    eps,
    sc_ptr, sh_ptr,  # a modulation's scale and shift (unused unless MODULATE)
    ITERS: tl.constexpr,  # 4-vectors per thread: ceil(N / (4 * THREADS))
    THREADS: tl.constexpr,  # 128 as ATen; 32 when N <= 128 (warps 1-3 hold nothing, +0 adds nothing)
    HAS_WEIGHT: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per program (ATen: one per block; short rows share a program here)
    INTERPRET: tl.constexpr,
    MODULATE: tl.constexpr = (),  # (): none; else modulation(...): the output modulated as eager's chain
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    o_row = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None]
    cols = tl.arange(0, 4 * THREADS)  # thread t = lane + 32 * warp reads 4-vectors t, t + THREADS, ...
    acc = tl.zeros((BLOCK_R, THREADS), tl.float32)
    grid_dependency_wait()
    # A row of several tiles is read twice: the first read keeps it in L2, the second evicts it,
    # and the output (a long row's: far more than L2 holds) is written to leave it. A row of one
    # tile (a QK norm's head) is read once and evicted first: the projection it normalizes is
    # dead after it, while the output goes on to the attention (both measured:
    # bench/results/README.md).
    for k in tl.static_range(ITERS):
        col = cols + k * 4 * THREADS
        v = tl.load(x_row + col[None, :], mask=row_ok[:, None] & (col < N)[None, :], other=0.0,
                    eviction_policy="evict_last" if ITERS > 1 else "evict_first")
        acc = fused_sum_squares(acc, v)
    r = fused_inv_rms(acc, N, eps, INTERPRET)[:, None]
    for k in tl.static_range(ITERS):
        col = cols + k * 4 * THREADS
        mask = row_ok[:, None] & (col < N)[None, :]
        if ITERS > 1:  # a single tile is still in registers
            v = tl.load(x_row + col[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        y = r * v.to(tl.float32)
        if HAS_WEIGHT:
            y = tl.load(w_ptr + col, mask=col < N, other=0.0).to(tl.float32)[None, :] * y
        if len(MODULATE) > 0:
            y = _modulate_rows(y, sc_ptr, sh_ptr, rows, col, mask, n1, n2, MODULATE)
        tl.store(o_row + col[None, :], y.to(out_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first" if ITERS > 1 else "")


def _out_dtype(x, weight) -> torch.dtype:
    if weight is None:
        return x.dtype
    return weight.dtype if weight.dtype in _HALF else torch.promote_types(torch.float32, weight.dtype)


def _last_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def aten_reduce_is_one_warp(n_rows: int, n: int) -> bool:
    """Whether ATen reduces each row with one warp and nothing else (``setReduceConfig``):
    block.x == 32 lanes, no split of a row across warps or blocks. Few rows widen block.x."""
    if n < LANES or n > MAX_N:
        return False
    dim0 = n // 4 if n >= VECTORIZE_MIN else n
    dim0_pow2 = _last_pow2(dim0) if dim0 < MAX_THREADS else MAX_THREADS
    dim1_pow2 = _last_pow2(n_rows) if n_rows < MAX_THREADS else MAX_THREADS
    width = min(dim0_pow2, LANES)
    height = min(dim1_pow2, MAX_THREADS // width)
    width = min(dim0_pow2, MAX_THREADS // height)
    values_per_thread = -(-n // width)
    return width == LANES and values_per_thread < min(height * 16, 256)


def _fused_supported(x, weight) -> bool:
    n = x.shape[-1]
    if n % 4 or n > MAX_N or x.stride(-1) != 1:
        return False
    if x.is_contiguous() and not aligned_vec4(x):  # a strided x is copied (aligned) by eager
        return False
    return weight is None or (weight.dtype == x.dtype and weight.shape == (n,) and weight.stride(0) == 1
                              and aligned_vec4(weight) and weight.device == x.device)


def supported_layout(x, weight, eps, form) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not (x.dtype in DTYPES and 1 <= x.dim() <= 4 and x.numel() > 0 and rows_fit(x, x.shape[-1])):
        return False
    if form == "fused":
        return _fused_supported(x, weight)
    if form != "diffusers" or eps is None:
        return False
    n = x.shape[-1]
    if (n >= VECTORIZE_MIN and n % 4) or not aten_reduce_is_one_warp(x.numel() // n, n):
        return False
    return weight is None or (weight.dtype in DTYPES and weight.shape == (n,) and weight.device == x.device)


def can_use(x, weight, eps, form) -> bool:
    return x.is_cuda and supported_layout(x, weight, eps, form)


def mean_factor(n_rows: int, n: int) -> float:
    """ATen's mean scale, ``float(num_outputs) / numel`` in fp32."""
    return float(np.float32(n_rows) / np.float32(n_rows * n))


def fused_launch(n: int) -> dict:
    """The fused form's launch for rows of ``n``: ``THREADS`` per row (ATen's 128; 32 for rows up
    to 128, where warps 1-3 would hold nothing), ``ITERS`` 4-vectors a thread, ``BLOCK_R`` rows a
    program (about 2048 elements), warps."""
    threads = 32 if n <= 128 else 128
    block_r = _last_pow2(max(1, 2048 // (4 * threads * triton.cdiv(n, 4 * threads))))
    return dict(ITERS=triton.cdiv(n, 4 * threads), THREADS=threads, BLOCK_R=block_r,
                num_warps=2 if threads == 32 else 4)  # measured: 2 warps best for short rows


@cached_plan
def _plan(x, form, scale=None, shift=None):
    """``(out strides, grid, ints, consts, factor, (sc strides, sh strides))``; with a ``scale``
    (and ``shift``), the output is the modulation's, contiguous as eager's chain leaves it."""
    if scale is None:
        out = torch.empty_strided(x.shape, like_strides(x), device="meta")
    else:
        out = torch.empty(x.shape, device="meta")
    operands = [x, out] + [t for t in (scale, shift) if t is not None]
    shape, (sx, so, *smod) = merge_rows(shape4(x.shape), [strides4(t, x.shape) for t in operands])
    n_rows, n = shape[0] * shape[1] * shape[2], shape[3]
    if form == "fused":
        ints = (n_rows, shape[1], shape[2], n, *sx[:3], *so[:3])
        consts = fused_launch(n)
    else:
        block_n = triton.next_power_of_2(n)
        # a row a warp, as ATen's mean takes it, about 1024 elements a one-warp program (per
        # head, measured at D=128: 14.9 against 16.6 us)
        block_r, warps = max(1, 1024 // block_n), 1
        ints = (n_rows, shape[1], shape[2], *sx, *so)
        vectorized = n >= VECTORIZE_MIN
        consts = dict(N=n, VECTORIZED=vectorized, ITERS=triton.cdiv(n, 4 * LANES if vectorized else LANES),
                      BLOCK_R=block_r, BLOCK_N=block_n, num_warps=warps)
    return out.stride(), (triton.cdiv(n_rows, consts["BLOCK_R"]),), ints, consts, mean_factor(n_rows, n), tuple(smod)


def bind(x, weight, eps, form, scale=None, shift=None):
    """:func:`rms_norm` for inputs of this signature, its host arithmetic done; with a ``scale``
    (and ``shift``) the norm's output modulated in the same pass (:mod:`.rmsnorm_modulate`). The
    launch takes rms_norm's arguments, or rmsnorm_modulate's."""
    out_strides, grid, ints, consts, factor, smod = _plan(x, form, scale, shift)
    norm_dtype = x.dtype if form == "fused" else _out_dtype(x, weight)
    out_dtype, modulate = norm_dtype, ()
    if scale is not None:
        product, out_dtype = out_dtypes(norm_dtype, scale, shift)
        modulate = modulation(norm_dtype, product, smod[0], smod[1] if shift is not None else None)
    options = dict(consts, HAS_WEIGHT=weight is not None, INTERPRET=INTERPRET, MODULATE=modulate,
                   enable_fp_fusion=False)
    if form == "fused":
        kernel = _rms_norm_fused_kernel.bind(grid, **options)
        tail = (FLT_EPSILON if eps is None else eps,)
    else:
        round_dtype = weight.dtype if weight is not None and weight.dtype in _HALF else torch.float32
        kernel = _rms_norm_diffusers_kernel.bind(grid, ROUND_DTYPE=TL_DTYPE[round_dtype], **options)
        tail = (eps, factor)
    shape = x.shape

    def launch(x, weight, eps=None, form=None, scale=None, shift=None):
        out = torch.empty_strided(shape, out_strides, dtype=out_dtype, device=x.device)
        kernel(x, weight if weight is not None else x, out, *ints, *tail,
               scale if scale is not None else x, shift if shift is not None else x)
        return out

    return launch


def rms_norm(x, weight, eps, form):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, eps, form)(x, weight)


RMS_NORM = Impl(run=rms_norm, supports=supported_layout, bind=bind)
