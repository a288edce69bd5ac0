"""Triton sgdiff::layernorm_modulate, bitwise equal to eager on CUDA.

Eager chain and its rounding steps (dtype T = bf16, fp16 or fp32 throughout; with
``x_dtype``/``out_dtype`` a bf16/fp16 x is read as the fp32 T it is cast to, and the
result cast to ``out_dtype`` when stored, as Wan's ``(norm(x.float()) ... ).type_as(x)``)::

    y = layer_norm(x, [N], w, b, eps)   # ATen vectorized kernel: Welford stats (welford.py),
                                        # y = rstd * (x - mean) [fma(w, ., b) when affine]
                                        # rounded once to T
    f = scale + 1                       # fp32 add, rounded to T
    y = y * f                           # fp32 mul, rounded to T
    y = y + shift                       # fp32 add, rounded to T

One program normalizes one row with 4 warps, as ATen does; it reads the row once for the
statistics and normalizes it from registers or, where registers are better spent
(:func:`_keep_row`), reads it again from cache. Where rows are short (Sana, PixArt, Flux,
Wan 2.1 1.3B: :func:`_warp_row`) a Gluon kernel gives each row one warp instead, each lane
holding four of ATen's threads: the same combines in the same order, far fewer instructions,
and the counts on the tree's path compiled in (:func:`warp_row_tree_terms`); its second pass
sends a group of tiles' loads, or the next tile's, out before their stores
(:func:`_warp_row_second_pass`).
``scale``/``shift`` are read through broadcast strides ``[B, S, N]`` so chunk views,
``[:, None]`` rows and per-token tensors need no copy.

sgdiff::layer_norm (:mod:`sgdiff.kernels.triton.layer_norm`) is the same normalization without
the modulation; its rows longer than 128 take these kernels, without scale and shift.
"""
from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import cast_copy, layernorm_channels_first
from sgdiff.kernels.triton.cuda_math import INTERPRET, rsqrtf, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, TL_DTYPE, cached_plan
from sgdiff.kernels.triton.welford import (
    THREADS,
    THREADS_C,
    VEC,
    VEC_C,
    _warp_row_stats,
    aligned_vec4,
    aten_affine,
    fold_vector,
    load_row,
    modulate_rounded,
    row_welford,
    warp_row_tree_terms,
)

log = logging.getLogger("sgdiff")

try:  # Triton's layout-explicit dialect (triton >= 3.5); not run by the interpreter
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:
    gluon = None


@LeanKernel
@triton.jit
def _layernorm_modulate_kernel(
    x_ptr,  # [B, S, N] input, last dim contiguous
    w_ptr,  # [N] LayerNorm weight (unused unless HAS_WEIGHT)
    b_ptr,  # [N] LayerNorm bias (unused unless HAS_BIAS)
    scale_ptr,  # scale broadcast to [B, S, N] through (stride_scb, stride_scs, stride_scn)
    shift_ptr,  # shift, likewise (unused unless HAS_SHIFT)
    out_ptr,  # [B, S, N] contiguous output
    S,  # rows per batch entry
    N: tl.constexpr,  # normalized size, a multiple of 4, compiled in: full vectors' masks fold away
    stride_xb, stride_xs,  # x strides (elements)
    stride_scb, stride_scs, stride_scn,  # scale strides (0 where broadcast)
    stride_shb, stride_shs, stride_shn,  # shift strides (0 where broadcast)
    eps,  # fp32
    rows,  # B * S (the grid's size here; the warp-row kernel's bound)
    scale_add_ptr,  # what eager added to scale before the chain (unused unless HAS_SCALE_ADD), broadcast
    shift_add_ptr,  # likewise for shift (unused unless HAS_SHIFT_ADD)
    stride_sab, stride_sas, stride_san,  # scale addend strides (0 where broadcast)
    stride_hab, stride_has, stride_han,  # shift addend strides
    ITERS: tl.constexpr,  # ceil(N / 4 / 128)
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    PLUS_ONE: tl.constexpr,  # factor is (scale + 1) rather than scale
    DTYPE: tl.constexpr,  # T, the dtype eager's chain rounds to (out_ptr's may differ: a cast)
    INTERPRET: tl.constexpr,
    HAS_SCALE: tl.constexpr = True,  # False: the LayerNorm alone (sgdiff::layer_norm)
    KEEP_ROW: tl.constexpr = False,  # normalize the row held in registers rather than reading it again
    GROUP: tl.constexpr = 1,  # second-pass tiles whose loads go out together, before their stores (load_tile)
    HAS_SCALE_ADD: tl.constexpr = False,  # scale is scale + scale_add, summed in fp32 and rounded to DTYPE
    HAS_SHIFT_ADD: tl.constexpr = False,
):
    row, x_row, vecs, mean, rstd, sc_row, sh_row, adds = row_start(
        x_ptr, scale_ptr, shift_ptr, scale_add_ptr, shift_add_ptr, S, N, stride_xb, stride_xs, stride_scb, stride_scs,
        stride_shb, stride_shs, stride_sab, stride_sas, stride_san, stride_hab, stride_has, stride_han, eps, ITERS,
        INTERPRET)
    t = tl.arange(0, THREADS_C)
    lane = tl.arange(0, VEC_C)
    tiles = ((), (), (), (), ())
    for g in tl.static_range(0, ITERS, GROUP):
        for k in tl.static_range(g, g + GROUP):
            if k < ITERS:
                col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]  # [128, 4]
                tiles = load_tile(tiles, vecs, k, x_row, w_ptr, b_ptr, sc_row, sh_row, col, stride_scn, stride_shn,
                                  col < N, KEEP_ROW, HAS_WEIGHT, HAS_BIAS, HAS_SCALE, HAS_SHIFT, adds,
                                  HAS_SCALE_ADD, HAS_SHIFT_ADD, DTYPE)
        for k in tl.static_range(g, g + GROUP):
            if k < ITERS:
                col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]
                store_tile(tiles, k, out_ptr + row * N, col, col < N, mean, rstd, PLUS_ONE, DTYPE)


@triton.jit
def row_start(x_ptr, scale_ptr, shift_ptr, scale_add_ptr, shift_add_ptr, S, N: tl.constexpr, stride_xb, stride_xs,
              stride_scb, stride_scs, stride_shb, stride_shs, stride_sab, stride_sas, stride_san, stride_hab,
              stride_has, stride_han, eps, ITERS: tl.constexpr, INTERPRET: tl.constexpr):
    """A 4-warp program's row (one a program): its index, x's row pointer, its vectors (read
    once), ATen's mean and rstd of them, and the scale's, shift's and addends' row pointers
    (:func:`load_tile`'s)."""
    pid = tl.program_id(0)  # 32-bit: a 64-bit division is a long software sequence
    row = pid.to(tl.int64)
    bi = (pid // S).to(tl.int64)
    si = (pid % S).to(tl.int64)
    x_row = x_ptr + bi * stride_xb + si * stride_xs
    grid_dependency_wait()
    vecs = load_row(x_row, N // VEC_C, ITERS)
    mean, m2, _ = row_welford(vecs, N // VEC_C, ITERS)
    var = tl.math.div_rn(m2, tl.full(m2.shape, N, tl.float32))
    rstd = rsqrtf(var + eps, INTERPRET)
    sc_row = scale_ptr + bi * stride_scb + si * stride_scs
    sh_row = shift_ptr + bi * stride_shb + si * stride_shs
    adds = (scale_add_ptr + bi * stride_sab + si * stride_sas, stride_san,
            shift_add_ptr + bi * stride_hab + si * stride_has, stride_han)
    return row, x_row, vecs, mean, rstd, sc_row, sh_row, adds


@triton.jit
def load_tile(tiles, vecs, k: tl.constexpr, x_row, w_ptr, b_ptr, sc_row, sh_row, col, stride_scn, stride_shn, mask,
              KEEP_ROW: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
              HAS_SHIFT: tl.constexpr, adds, HAS_SCALE_ADD: tl.constexpr, HAS_SHIFT_ADD: tl.constexpr,
              DTYPE: tl.constexpr):
    """``tiles`` (the row's vectors, weights, biases, scales and shifts of the tiles loaded so
    far) with the k-th, at columns ``col``, appended: the row's ``vecs[k]`` where it is kept, else
    read again (from L2); ``*_row`` point at the row's x, scale and shift. A second pass loads a
    group of tiles before it stores any: the compiler never moves a load past a store (the
    output may alias an input), so tile by tile each tile waits its loads' latency. ``adds``:
    the scale's and shift's addends (row pointer, column stride each) where eager summed them
    first (``HAS_*_ADD``): the fp32 sum rounded to DTYPE, as eager's add stored it."""
    xs, ws, bs, scs, shs = tiles
    xs = xs + (vecs[k] if KEEP_ROW else tl.load(x_row + col, mask=mask),)
    if HAS_WEIGHT:
        ws = ws + (tl.load(w_ptr + col, mask=mask),)
    if HAS_BIAS:
        bs = bs + (tl.load(b_ptr + col, mask=mask),)
    if HAS_SCALE:
        sc = tl.load(sc_row + col * stride_scn, mask=mask)
        if HAS_SCALE_ADD:
            sc = (sc.to(tl.float32) + tl.load(adds[0] + col * adds[1], mask=mask).to(tl.float32)).to(DTYPE)
        scs = scs + (sc,)
    if HAS_SHIFT:
        sh = tl.load(sh_row + col * stride_shn, mask=mask)
        if HAS_SHIFT_ADD:
            sh = (sh.to(tl.float32) + tl.load(adds[2] + col * adds[3], mask=mask).to(tl.float32)).to(DTYPE)
        shs = shs + (sh,)
    return xs, ws, bs, scs, shs


@triton.jit
def store_tile(tiles, k: tl.constexpr, out_row, col, mask, mean, rstd, PLUS_ONE: tl.constexpr,
               DTYPE: tl.constexpr):
    """Store the k-th of ``tiles`` normalized and modulated (:func:`modulated_tile`) at columns
    ``col`` of the output's row ``out_row``."""
    y = modulated_tile(tiles, k, mean, rstd, PLUS_ONE, DTYPE)
    tl.store(out_row + col, y.to(out_row.dtype.element_ty), mask=mask)


@triton.jit
def modulated_tile(tiles, k: tl.constexpr, mean, rstd, PLUS_ONE: tl.constexpr, DTYPE: tl.constexpr):
    """The k-th of ``tiles`` (:func:`load_tile`) normalized and modulated, rounded as eager does
    (DTYPE; the caller casts to the output's dtype)."""
    xs, ws, bs, scs, shs = tiles
    centered = to_fp32(xs[k]) - mean
    y = aten_affine(rstd * centered, rstd, centered, to_fp32(ws[k]) if len(ws) > 0 else None,
                    to_fp32(bs[k]) if len(bs) > 0 else None)
    return modulate_rounded(y.to(DTYPE), scs[k] if len(scs) > 0 else None, shs[k] if len(shs) > 0 else None,
                            PLUS_ONE, len(scs) > 0, len(shs) > 0, DTYPE)


if gluon is not None:
    @gluon.jit
    def _warp_row_tile(l, j, k: gl.constexpr, row_ok, N: gl.constexpr, EVEN_ROWS: gl.constexpr):
        """Columns and mask of the k-th ``[rows, 128, 4]`` tile: ATen thread l's vector l + 128 k."""
        v = l + k * THREADS_C
        mask = (v < N // VEC_C)[None, :, None]
        if not EVEN_ROWS:
            mask = row_ok[:, None, None] & mask
        return v[None, :, None] * VEC_C + j[None, None, :], mask

    @gluon.constexpr_function
    def _load_step(k, GROUP, AHEAD, EARLY):
        """The step of the warp-row kernel's second pass at which tile k's loads go out: that of
        the group AHEAD tiles before it (a group's stores wait for none of the loads after them);
        -1, before the statistics, for the first EARLY tiles."""
        return -1 if k < EARLY else max(0, k - AHEAD) // GROUP

    @gluon.constexpr_function
    def _full_tile(k, N, EVEN_ROWS):
        """Whether the k-th tile lies in the row for every row of the grid: its loads need no
        mask (a masked load zeroes its registers first, an instruction a load)."""
        return EVEN_ROWS and (k + 1) * THREADS_C * VEC_C <= N

    @LeanKernel
    @gluon.jit
    def _layernorm_modulate_warp_row_kernel(
        x_ptr, w_ptr, b_ptr, scale_ptr, shift_ptr, out_ptr,  # as _layernorm_modulate_kernel's
        S,
        N: gl.constexpr,  # compiled in: a full vector's masks and loads' offsets fold away
        stride_xb, stride_xs, stride_scb, stride_scs, stride_scn, stride_shb, stride_shs, stride_shn,
        eps, rows,
        ITERS: gl.constexpr,
        HAS_WEIGHT: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        HAS_SHIFT: gl.constexpr,
        PLUS_ONE: gl.constexpr,
        DTYPE: gl.constexpr,
        INTERPRET: gl.constexpr,
        HAS_SCALE: gl.constexpr,
        ROWS: gl.constexpr,
        LAYOUT: gl.constexpr,  # warp_row_layout(ROWS, num_warps)
        EVEN_ROWS: gl.constexpr,  # rows a multiple of ROWS: no row mask
        TREE: gl.constexpr,  # warp_row_tree_terms(N)
        KEEP_ROW: gl.constexpr = False,  # normalize the first pass's registers rather than reading the row again
        GROUP: gl.constexpr = 1,  # second-pass tiles whose loads go out together, before their stores
        S_CONST: gl.constexpr = 0,  # S compiled in (the batch index an unsigned multiply), or 0: S at run time
        AHEAD: gl.constexpr = 0,  # second-pass tiles whose loads go out ahead of a group's (_load_step)
        EARLY: gl.constexpr = 0,  # tiles whose second-pass loads go out before the statistics
    ):
        """_layernorm_modulate_kernel with a row a warp instead of a row a 4-warp program, for
        rows of N % 64 == 0 (:func:`_warp_row`).

        ATen's 128 threads of a row are ``l = 64 a + 32 b + 16 hi + lo``; lane ``16 b + lo``
        holds the states of threads with a, hi in {0, 1}, and :func:`_warp_row_stats` takes
        ATen's tree over them with its count terms compiled in: no shared memory, no barrier,
        and a program's warps never wait for one another."""
        LANES: gl.constexpr = gl.SliceLayout(2, LAYOUT)  # [ROWS, 128]: ATen's threads' states
        ROW: gl.constexpr = gl.SliceLayout(1, LANES)
        r = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=ROW)  # 32-bit
        row_ok = r < rows
        row = r.to(gl.int64)
        if S_CONST:
            bi = (r.to(gl.uint32) // S_CONST).to(gl.int64)
            si = (r.to(gl.uint32) % S_CONST).to(gl.int64)
        else:
            bi = (r // S).to(gl.int64)
            si = (r % S).to(gl.int64)
        l = gl.arange(0, THREADS_C, layout=gl.SliceLayout(0, LANES))
        j = gl.arange(0, VEC_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, LAYOUT)))
        n_vec = N // VEC_C
        x_row = (bi * stride_xb + si * stride_xs)[:, None, None]
        grid_dependency_wait()
        vecs = ()
        for k in gl.static_range(ITERS):  # every load issued before any is used
            col, mask = _warp_row_tile(l, j, k, row_ok, N, EVEN_ROWS)
            if _full_tile(k, N, EVEN_ROWS):
                vec = gl.load(x_ptr + x_row + col)
            else:  # idle threads fold in zeros, as ATen's
                vec = gl.load(x_ptr + x_row + col, mask=mask, other=0.0)
            vecs = vecs + (vec,)
        zero = gl.zeros([ROWS, THREADS_C], gl.float32, LANES)
        mean, m2, n = zero, zero, zero
        for k in gl.static_range(ITERS):  # each thread's serial Welford, as row_welford's
            even, odd = gl.split(gl.reshape(to_fp32(vecs[k]), [ROWS, THREADS_C, 2, 2]))
            x0, x2 = gl.split(even)
            x1, x3 = gl.split(odd)
            xs = (gl.convert_layout(x0, LANES), gl.convert_layout(x1, LANES),  # the same layout: no data moves
                  gl.convert_layout(x2, LANES), gl.convert_layout(x3, LANES))
            active = (l[None, :] + k * THREADS_C < n_vec) & (zero == 0.0)  # [ROWS, 128]
            mean, m2, n = fold_vector(mean, m2, n, xs, active, k, ITERS)
        sc_row = (bi * stride_scb + si * stride_scs)[:, None, None]
        sh_row = (bi * stride_shb + si * stride_shs)[:, None, None]
        # load_tile and store_tile written out: through the helpers, ptxas schedules this kernel
        # otherwise, in more registers and slower
        xs, ws, bs, scs, shs = (), (), (), (), ()
        for step in gl.static_range(-1, ITERS):  # step -1: the statistics, after the loads EARLY sends
            for k in gl.static_range(ITERS):
                if _load_step(k, GROUP, AHEAD, EARLY) == step:
                    col, mask = _warp_row_tile(l, j, k, row_ok, N, EVEN_ROWS)
                    if _full_tile(k, N, EVEN_ROWS):
                        mask = None
                    # the row is kept as loaded: kept converted to fp32, it doubles the registers
                    # and is slower
                    xs = xs + (vecs[k] if KEEP_ROW else gl.load(x_ptr + x_row + col, mask=mask),)
                    if HAS_WEIGHT:
                        ws = ws + (gl.load(w_ptr + col, mask=mask),)
                    if HAS_BIAS:
                        bs = bs + (gl.load(b_ptr + col, mask=mask),)
                    if HAS_SCALE:
                        scs = scs + (gl.load(scale_ptr + sc_row + col * stride_scn, mask=mask),)
                    if HAS_SHIFT:
                        shs = shs + (gl.load(shift_ptr + sh_row + col * stride_shn, mask=mask),)
            if step == -1:
                mean, rstd = _warp_row_stats(mean, m2, l, eps, N, TREE, LANES, INTERPRET)
            for k in gl.static_range(ITERS):
                if k // GROUP == step:
                    col, mask = _warp_row_tile(l, j, k, row_ok, N, EVEN_ROWS)
                    if _full_tile(k, N, EVEN_ROWS):
                        mask = None
                    centered = to_fp32(xs[k]) - mean[:, :, None]
                    y = aten_affine(rstd[:, :, None] * centered, rstd[:, :, None], centered,
                                    to_fp32(ws[k]) if HAS_WEIGHT else None, to_fp32(bs[k]) if HAS_BIAS else None)
                    y = modulate_rounded(y.to(DTYPE), scs[k] if HAS_SCALE else None,
                                         shs[k] if HAS_SHIFT else None, PLUS_ONE, HAS_SCALE, HAS_SHIFT, DTYPE)
                    gl.store(out_ptr + row[:, None, None] * N + col, y.to(out_ptr.dtype.element_ty), mask=mask)

    @functools.lru_cache(maxsize=None)
    def warp_row_layout(rows: int, warps: int):
        """The ``[rows, 128, 4]`` tile (row, ATen thread l = 64 a + 32 b + 16 hi + lo, vector
        entry) of :func:`_layernorm_modulate_warp_row_kernel`: the entry, hi and a in a
        thread's registers, lo and b across the lanes, a row a warp, rows past the warps in
        registers. Both powers of two, rows a multiple of warps."""
        assert rows % warps == 0 and rows & (rows - 1) == 0 and warps & (warps - 1) == 0
        reg = [[0, 0, 1], [0, 0, 2], [0, 16, 0], [0, 64, 0]]
        reg += [[warps << k, 0, 0] for k in range((rows // warps).bit_length() - 1)]
        lane = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 32, 0]]
        warp = [[1 << k, 0, 0] for k in range(warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [rows, 128, 4])
else:
    _layernorm_modulate_warp_row_kernel = warp_row_layout = None


def can_use(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None,
            scale_addend=None, shift_addend=None) -> bool:
    """Inputs on which eager takes ATen's vectorized LayerNorm and every operand is one dtype."""
    return x.is_cuda and supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype,
                                          scale_addend, shift_addend)


def supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None,
                     scale_addend=None, shift_addend=None) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors). A
    scale (shift) with an addend is their sum, which must promote to the dtype normalized in."""
    if not _norm_ok(x, weight, bias, x_dtype, out_dtype):
        return False
    if shift_addend is not None and shift is None:
        return False
    dtype = x_dtype or x.dtype
    for p, a in ((scale, scale_addend), (shift, shift_addend)):
        if p is None:
            continue
        summed = p.dtype if a is None else torch.promote_types(p.dtype, a.dtype)
        for t in (p, a) if a is not None else (p,):
            if t.dtype not in DTYPES or t.device != x.device or t.dim() > x.dim():
                return False
        if summed != dtype:
            return False
        try:
            torch.broadcast_shapes(*(t.shape for t in (x, p, a) if t is not None))
        except RuntimeError:
            return False
    return scale is not None


def _norm_ok(x, weight, bias, x_dtype=None, out_dtype=None, device=None) -> bool:
    """Rows (2-D or 3-D x) on which eager takes ATen's vectorized LayerNorm, parameters in the
    dtype it normalizes in on ``device`` (x's own unless x stands in for a copy). ``x_dtype``
    may only widen a bf16/fp16 x to fp32 (exact: the kernel reads x and widens it itself)."""
    if not (x.dtype in DTYPES and 2 <= x.dim() <= 3 and x.numel() > 0 and out_dtype in (None, *DTYPES)):
        return False
    if x_dtype is not None and not (x_dtype == torch.float32 or x_dtype == x.dtype):
        return False
    n = x.shape[-1]
    if n % VEC or n > 2**24:
        return False
    # eager normalizes x.contiguous(): a copy (aligned) when x is strided, else x itself (or
    # the fresh tensor of its cast); where the last dim is strided too (channels-first storage
    # read as [B, S, D]), the launch makes that copy as eager does (:func:`bind`)
    if x.is_contiguous() and x_dtype in (None, x.dtype) and not aligned_vec4(x):
        return False
    if bias is not None and weight is None:
        # eager's bits there are neither of its vectorized kernel's sums, rstd * (x - mean) + b
        # fused or not (measured on an H200): not reproduced
        return False
    for p in (weight, bias):
        if p is not None and (p.dtype != (x_dtype or x.dtype) or p.dim() != 1 or p.stride(0) != 1
                              or not aligned_vec4(p) or p.device != (device or x.device)):
            return False
    return True


@cached_plan
def _plan(x, scale, shift, scale_addend=None, shift_addend=None):
    shape = (1, *x.shape) if x.dim() == 2 else tuple(x.shape)
    B, S, N = shape
    x3 = x.view(shape)

    def strides(t):
        return t.expand(shape).stride() if t is not None else (0, 0, 0)

    return shape, (B * S,), (S, N, x3.stride(0), x3.stride(1), *strides(scale), *strides(shift)), \
        triton.cdiv(N // VEC, THREADS), (*strides(scale_addend), *strides(shift_addend))


WARP_ROW_ITERS = 6  # _warp_row: rows of at most this many vectors a thread


def _warp_row(N: int, iters: int) -> bool:
    """Rows of at most 6 vectors a thread take the warp-row kernel, where N % 64 == 0 (every
    real model's: the counts on its tree's path are then known, see :func:`warp_row_tree_terms`;
    other rows take the 4-warp kernel). There the 4-warp kernel is bound by its instructions'
    issue, a third of them the four warps' shuffle trees. On longer rows (Wan-14B's 10 vectors a
    thread) it is slower: a row's registers a thread, four times the 4-warp kernel's, cost more
    than the instructions saved."""
    return iters <= WARP_ROW_ITERS and N % 64 == 0


FEW_ROWS, SHORT_ITERS = 8192, 5  # _keep_row: at most this many rows of at most this many vectors a thread


def _keep_row(x, rows: int, iters: int) -> bool:
    """The 4-warp kernel (long rows, or a Triton without Gluon) normalizes the row from
    registers rather than reading it again. It pays where the second read is costly (x fp32 in
    memory) and where a grid of few, short rows is latency-bound (Sana, PixArt); with many bf16
    rows or more than 5 vectors a thread the registers it takes cost more."""
    return x.element_size() == 4 or (rows <= FEW_ROWS and iters <= SHORT_ITERS)


WARP_ROW_PROGRAM = (1, 1)  # the warp-row kernel's rows a program and warps, as measured
ONE_WAVE_WARPS = 16  # one-warp programs an SM holds at the registers of a row kept (up to 128 a thread)
ONE_WAVE_REGISTERS = 65536 // (32 * ONE_WAVE_WARPS)  # 128: a thread's share of an SM's registers at that count
FEW_WAVES_WARPS = 64  # rows an SM at most where the second pass's loads all go out together


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def _warp_row_second_pass(rows: int, S: int, iters: int, affine: bool, device: torch.device) -> dict:
    """How the warp-row kernel's second pass reads its operands: KEEP_ROW, GROUP (tiles whose
    loads go out before their stores), S_CONST, AHEAD and EARLY (:func:`_load_step`), and a
    register cap:

    - a row whose grid is resident at once is kept in registers (nothing overlaps the second
      pass, its five loads a vector are the kernel's tail), with S at run time: compiled in,
      ptxas spreads each tile's loads. Each tile's loads go out one tile ahead of the stores, at
      most 128 registers a thread so that the grid stays one wave. The first tiles' loads also
      go out before the statistics, two without an affine LayerNorm, one with it (two spill at
      the cap): ptxas then issues them among the tree's shuffles rather than after it. Rows of
      6 vectors a thread spill at that cap: they keep the earlier way (affine: tile by tile;
      otherwise read again, below). Slower, so not kept: the affine row read again, grouped or
      one or two tiles ahead; the kept row and four operands a tile grouped (more than 128
      registers); two rows a warp; the weight and bias widened once a program in shared memory;
    - otherwise the row is read again with S compiled in and, where an SM holds at most 64 rows,
      the tiles' loads grouped: all of them for rows of up to 5 vectors a thread, two at a time
      for Flux's 6 unless affine. Where rows take many waves (Wan 2.1 1.3B) grouped loads cost
      more registers than the latency they hide: tile by tile."""
    sms = _sm_count(device)
    one_wave = rows <= ONE_WAVE_WARPS * sms
    if one_wave and iters <= 5:
        return dict(KEEP_ROW=True, GROUP=1, S_CONST=0, AHEAD=1, EARLY=1 if affine else 2, maxnreg=ONE_WAVE_REGISTERS)
    if one_wave and affine:
        return dict(KEEP_ROW=True, GROUP=1, S_CONST=0)
    group = 1
    if rows <= FEW_WAVES_WARPS * sms:
        group = iters if iters <= 5 else 1 if affine else 2
    return dict(KEEP_ROW=False, GROUP=group, S_CONST=S)


def _bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, device=None,
          scale_addend=None, shift_addend=None):
    """The launch for inputs of this signature: ``launch(x, weight, bias, scale, shift, scale_addend,
    shift_addend)``; ``device`` where x stands in (meta) for the rows. Addends take the 4-warp
    kernel (the warp-row kernel has none)."""
    shape, grid, ints, iters, add_ints = _plan(x, scale, shift, scale_addend, shift_addend)
    has_adds = (scale_addend is not None, shift_addend is not None)
    rows, N = grid[0], shape[-1]
    dtype = x_dtype or x.dtype
    out_dtype, view = out_dtype or dtype, x.shape
    options = dict(ITERS=iters, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                   HAS_SHIFT=shift is not None, PLUS_ONE=scale_plus_one, DTYPE=TL_DTYPE[dtype], INTERPRET=INTERPRET,
                   HAS_SCALE=scale is not None, enable_fp_fusion=False)
    # what the binds below need of the inputs, taken now: a launch holds no tensor of the call that
    # bound it (a site's bound launch lives as long as its graph; its first x would stay allocated)
    has_weight, device = weight is not None, device or x.device
    # the tiles' loads grouped where the row is read again; kept (fp32 rows), the row's registers
    # leave too few for them
    keep = _keep_row(x, rows, iters)

    def bind_gluon():
        per, warps = WARP_ROW_PROGRAM
        second_pass = _warp_row_second_pass(rows, shape[1], iters, has_weight, device)
        return _layernorm_modulate_warp_row_kernel.bind(
            (triton.cdiv(rows, per),), ROWS=per, LAYOUT=warp_row_layout(per, warps), EVEN_ROWS=rows % per == 0,
            TREE=warp_row_tree_terms(N), **second_pass, num_warps=warps, **options)

    def bind_triton():
        kernel = _layernorm_modulate_kernel.bind(grid, KEEP_ROW=keep, GROUP=1 if keep else iters, num_warps=4,
                                                 HAS_SCALE_ADD=has_adds[0], HAS_SHIFT_ADD=has_adds[1], **options)
        if any(has_adds):  # the launch passes the addends
            return lambda *args: kernel(*args, *add_ints)
        return lambda *args: kernel(*args, args[0], args[0], *add_ints)  # x stands in for both addends

    warp_row = _layernorm_modulate_warp_row_kernel is not None and _warp_row(N, iters) and not any(has_adds)
    kernel = _gluon_or_triton(bind_gluon if warp_row else None, bind_triton,
                              f"layernorm_modulate's Gluon kernel for rows of {N}")

    def launch(x, weight, bias, scale, shift, scale_addend=None, shift_addend=None):
        out = torch.empty(view, dtype=out_dtype, device=x.device)  # the kernel takes pointers: no view
        scale_arg = scale if scale is not None else x
        adds = () if not any(has_adds) else (scale_addend if scale_addend is not None else x,
                                              shift_addend if shift_addend is not None else x)
        kernel(x, weight if weight is not None else x, bias if bias is not None else x,
               scale_arg, shift if shift is not None else scale_arg, out, *ints, eps, rows, *adds)
        return out

    return launch


def bind(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None, scale_addend=None,
         shift_addend=None):
    """:func:`layernorm_modulate` for inputs of this signature, its host arithmetic done. An x
    whose last dim is strided (a transposed channels-first tensor) is normalized where it lies
    (:mod:`.layernorm_channels_first`: the rows ATen's LayerNorm copies out first, the same bits);
    with addends, or not 3-D, it is made contiguous first, as ATen makes it."""
    adds = dict(scale_addend=scale_addend, shift_addend=shift_addend)
    if layernorm_channels_first.supported(x, scale_addend, shift_addend):  # normalized where they lie
        launch = layernorm_channels_first.bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype)
        return lambda x, weight, bias, eps, scale, shift, *_: launch(x, weight, bias, scale, shift)
    if x.stride(-1) != 1:
        contiguous = _contiguous_copy(x)
        launch = _bind(contiguous(x), weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, **adds)
        return lambda x, weight, bias, eps, scale, shift, _p=None, _x=None, _o=None, sa=None, ha=None: launch(
            contiguous(x), weight, bias, scale, shift, sa, ha)
    launch = _bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, **adds)
    return lambda x, weight, bias, eps, scale, shift, _p=None, _x=None, _o=None, sa=None, ha=None: launch(
        x, weight, bias, scale, shift, sa, ha)


def _contiguous_copy(x):
    """``x.contiguous()`` for an ``x`` of these strides whose last dim is strided: ATen's copy of a
    transposed tensor reads or writes a sector per element (at 2 x 4096 x 1152 bf16, most of
    the LayerNorm-modulate's 147 µs where the kernel takes 8.4), so where :mod:`cast_copy`
    takes it the copy is its tiled transpose through shared memory: the same values, moved."""
    def as4(t):
        return t[None, None] if t.dim() == 2 else t.unsqueeze(1)

    x4 = as4(x)
    if not ((x.is_cuda or INTERPRET) and cast_copy.supported_layout(x4, x.dtype, False, (), 0.0, True)):
        return torch.Tensor.contiguous
    copy, shape = cast_copy.bind(x4, x.dtype, False, (), 0.0, True), x.shape
    return lambda x: copy(as4(x)).view(shape)


def layernorm_modulate(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None,
                       scale_addend=None, shift_addend=None):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend)(
        x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend)


_gluon_failed: list = []  # why the Gluon kernels could not run in this process, if they could not


def _gluon_or_triton(bind_gluon, bind_triton, what: str):
    """A launch of the Gluon kernel ``bind_gluon()`` where this process can run Gluon, else of
    the Triton one. Its first launch compiles it: a Triton whose Gluon differs (it raises) logs
    why and takes ``bind_triton()`` from then on, here and for every later signature."""
    if bind_gluon is None or INTERPRET or _gluon_failed:
        return bind_triton()
    kernel, first = bind_gluon(), True

    def launch(*args):
        nonlocal kernel, first
        if first:
            first = False
            try:
                return kernel(*args)
            except Exception as exc:
                _gluon_failed.append(f"{type(exc).__name__}: {exc}")
                log.warning("sgdiff: %s failed on this Triton (%s); using the Triton kernel", what,
                            _gluon_failed[-1].splitlines()[0][:200])
                kernel = bind_triton()
        return kernel(*args)

    return launch


LAYERNORM_MODULATE = Impl(run=layernorm_modulate, supports=supported_layout, bind=bind)
