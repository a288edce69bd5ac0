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

sgdiff::layer_norm is the same normalization without the modulation. Rows of at most 128
(per-head QK norms) pack many rows a program: on CUDA a Gluon kernel that holds each row as
ATen's threads hold it; elsewhere (the interpreter, a Triton without Gluon or whose Gluon
fails on it: logged) a Triton kernel that takes ATen's lane tree by halving the lane axis.
"""
from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from sgdiff.kernels.triton.cuda_math import INTERPRET, rsqrtf, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, TL_DTYPE, cached_plan
from sgdiff.kernels.triton.welford import (
    THREADS,
    THREADS_C,
    VEC,
    VEC_C,
    aligned_vec4,
    combine_with_terms,
    fold_empty_warps,
    fold_vector,
    load_row,
    pow2_reciprocal,
    row_welford,
    short_rows_welford,
    vector_welford,
    welford_combine,
    welford_combine_pow2,
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
):
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

    t = tl.arange(0, THREADS_C)
    lane = tl.arange(0, VEC_C)
    sc_row = scale_ptr + bi * stride_scb + si * stride_scs
    sh_row = shift_ptr + bi * stride_shb + si * stride_shs
    tiles = ((), (), (), (), ())
    for g in tl.static_range(0, ITERS, GROUP):
        for k in tl.static_range(g, g + GROUP):
            if k < ITERS:
                col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]  # [128, 4]
                tiles = load_tile(tiles, vecs, k, x_row, w_ptr, b_ptr, sc_row, sh_row, col, stride_scn, stride_shn,
                                  col < N, KEEP_ROW, HAS_WEIGHT, HAS_BIAS, HAS_SCALE, HAS_SHIFT)
        for k in tl.static_range(g, g + GROUP):
            if k < ITERS:
                col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]
                store_tile(tiles, k, out_ptr + row * N, col, col < N, mean, rstd, PLUS_ONE, DTYPE)


@triton.jit
def load_tile(tiles, vecs, k: tl.constexpr, x_row, w_ptr, b_ptr, sc_row, sh_row, col, stride_scn, stride_shn, mask,
              KEEP_ROW: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
              HAS_SHIFT: tl.constexpr):
    """``tiles`` (the row's vectors, weights, biases, scales and shifts of the tiles loaded so
    far) with the k-th, at columns ``col``, appended: the row's ``vecs[k]`` where it is kept, else
    read again (from L2); ``*_row`` point at the row's x, scale and shift. A second pass loads a
    group of tiles before it stores any: the compiler never moves a load past a store (the
    output may alias an input), so tile by tile each tile waits its loads' latency."""
    xs, ws, bs, scs, shs = tiles
    xs = xs + (vecs[k] if KEEP_ROW else tl.load(x_row + col, mask=mask),)
    if HAS_WEIGHT:
        ws = ws + (tl.load(w_ptr + col, mask=mask),)
    if HAS_BIAS:
        bs = bs + (tl.load(b_ptr + col, mask=mask),)
    if HAS_SCALE:
        scs = scs + (tl.load(sc_row + col * stride_scn, mask=mask),)
    if HAS_SHIFT:
        shs = shs + (tl.load(sh_row + col * stride_shn, mask=mask),)
    return xs, ws, bs, scs, shs


@triton.jit
def store_tile(tiles, k: tl.constexpr, out_row, col, mask, mean, rstd, PLUS_ONE: tl.constexpr,
               DTYPE: tl.constexpr):
    """Normalize and modulate the k-th of ``tiles`` (:func:`load_tile`), rounding as eager does,
    and store it at columns ``col`` of the output's row ``out_row``."""
    xs, ws, bs, scs, shs = tiles
    centered = to_fp32(xs[k]) - mean
    y = _affine(rstd * centered, rstd, centered, to_fp32(ws[k]) if len(ws) > 0 else None,
                to_fp32(bs[k]) if len(bs) > 0 else None)
    y = _modulate(y.to(DTYPE), scs[k] if len(scs) > 0 else None, shs[k] if len(shs) > 0 else None, PLUS_ONE,
                  len(scs) > 0, len(shs) > 0, DTYPE)
    tl.store(out_row + col, y.to(out_row.dtype.element_ty), mask=mask)


@triton.jit
def _modulate(y, sc, sh, PLUS_ONE: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
              DTYPE: tl.constexpr):
    """``y * (1 + scale) + shift`` on the LayerNorm output ``y`` (DTYPE), each step in fp32 and
    rounded to DTYPE as eager's."""
    if HAS_SCALE:
        f = sc.to(tl.float32)
        if PLUS_ONE:
            f = (f + 1.0).to(DTYPE).to(tl.float32)
        y = (y.to(tl.float32) * f).to(DTYPE)
    if HAS_SHIFT:
        y = (y.to(tl.float32) + sh.to(tl.float32)).to(DTYPE)
    return y


@triton.jit
def _normalize(x, mean, rstd, w_ptr, b_ptr, col, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """ATen's ``gamma * (rstd * (x - mean)) + beta`` in fp32 (nvcc's FMA), before rounding.
    Masked-off entries are never stored: their loads leave registers as they are."""
    y = rstd * (x - mean)
    w = to_fp32(tl.load(w_ptr + col, mask=mask)) if HAS_WEIGHT else None
    b = to_fp32(tl.load(b_ptr + col, mask=mask)) if HAS_BIAS else None
    return _affine(y, rstd, x - mean, w, b)


@triton.jit
def _affine(y, rstd, centered, w, b):
    """``y = rstd * centered`` through the LayerNorm's weight ``w`` and bias ``b`` (fp32, either
    None where absent) as ATen's kernel takes it: ``fma(w, y, b)``, ``w * y`` or ``fma(rstd, centered, b)``."""
    if w is not None:
        if b is not None:
            y = tl.fma(w, y, b)
        else:
            y = w * y
    elif b is not None:
        y = tl.fma(rstd, centered, b)
    return y


@LeanKernel
@triton.jit
def _layer_norm_short_rows_kernel(
    x_ptr,  # [M, N] contiguous rows
    w_ptr, b_ptr,  # [N] weight and bias (unused unless HAS_WEIGHT / HAS_BIAS)
    out_ptr,  # [M, N] contiguous
    M, N,  # N a multiple of 4, at most 128
    eps,
    ROWS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DTYPE: tl.constexpr,  # the dtype eager's LayerNorm rounds to (out_ptr's may differ: a cast)
    INTERPRET: tl.constexpr,
):
    """LayerNorm of ROWS short rows (head_dim) per program, each in its own warp's lanes."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    t = tl.arange(0, 32)  # one warp's lanes
    lane = tl.arange(0, VEC_C)
    active = (rows < M)[:, None] & (t < N // VEC_C)[None, :]  # [ROWS, 32]
    col = (t[:, None] * VEC_C + lane[None, :])[None, :, :]  # [1, 32, 4]
    mask = active[:, :, None]
    offs = rows[:, None, None] * N + col
    grid_dependency_wait()
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first"))  # as the Gluon kernel
    mean, m2, _ = short_rows_welford(x, active)
    var = tl.math.div_rn(m2, tl.full(m2.shape, N, tl.float32))
    rstd = rsqrtf(var + eps, INTERPRET)
    y = _normalize(x, mean[:, None, None], rstd[:, None, None], w_ptr, b_ptr, col, mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(out_ptr + offs, y.to(DTYPE).to(out_ptr.dtype.element_ty), mask=mask)


if gluon is not None:
    @gluon.jit
    def _row_lane0(v):
        """Every lane of an 8-lane segment (one row) takes the segment's first lane's value."""
        return gl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, 0, 0x181f, -1;", "=r,r", [v],
                                         dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _fold_last_axis(mean, m2, n, POW2: gl.constexpr):
        """Combine the two entries of the last (size-2, in-thread) axis: (own, other) = (0, 1)."""
        mean_own, mean_oth = gl.split(mean)
        m2_own, m2_oth = gl.split(m2)
        n_own, n_oth = gl.split(n)
        if POW2:
            return welford_combine_pow2(mean_own, m2_own, n_own, mean_oth, m2_oth, n_oth)
        else:
            return welford_combine(mean_own, m2_own, n_own, mean_oth, m2_oth, n_oth)

    @LeanKernel
    @gluon.jit
    def _layer_norm_warp_rows_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr, M,  # as _layer_norm_short_rows_kernel's
        N: gl.constexpr,  # compiled in: every count on the tree's path is then known to the compiler
        eps,
        ROWS: gl.constexpr,
        HAS_WEIGHT: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        DTYPE: gl.constexpr,
        INTERPRET: gl.constexpr,
        LAYOUT: gl.constexpr,  # warp_rows_layout(ROWS, num_warps)
        POW2: gl.constexpr,  # N // 4 a power of two: every count on the tree's path is 0 or 2**e
        EVEN_ROWS: gl.constexpr = False,  # M a multiple of ROWS
    ):
        """_layer_norm_short_rows_kernel with the layout written out (:func:`warp_rows_layout`).

        ATen's thread ``l`` of a row (l = 16 hi + 8 lo + t) folds the row's 4-vector ``l``; here
        lane ``t`` of an 8-lane segment holds the vectors of ATen's threads t, t + 8, t + 16 and
        t + 24 in registers. Shuffle-down's first two levels (offsets 16, 8) pair registers of
        one thread; the last three are ``gl.reduce`` over the 8 lanes, which Triton lowers to a
        butterfly (``shfl.bfly`` at offsets 4, 2, 1, each lane combining (own, other)) whose
        first lane follows shuffle-down's path. Other lanes may end elsewhere (a combine of
        unequal counts is not symmetric), so every lane then takes the first lane's state. No
        shared memory; a row's loads are 8 lanes reading 64 contiguous bytes (bf16) at a time."""
        LANES: gl.constexpr = gl.SliceLayout(2, LAYOUT)  # [ROWS, 32]: ATen's threads' states
        rows = gl.program_id(0).to(gl.int64) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LANES))
        t = gl.arange(0, 32, layout=gl.SliceLayout(0, LANES))
        j = gl.arange(0, VEC_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, LAYOUT)))
        # a lane's columns, broadcast over rows: constants per register (N is compiled in)
        lane_active = gl.zeros([ROWS, 32], gl.int32, LANES) + t[None, :] < N // VEC_C
        if EVEN_ROWS:  # M a multiple of ROWS: no row mask (all-true masks fold away)
            active = lane_active
        else:
            active = (rows < M)[:, None] & lane_active
        col = t[None, :, None] * VEC_C + j[None, None, :]
        mask = active[:, :, None]
        offs = rows[:, None, None] * N + col
        grid_dependency_wait()
        # q or k is dead after its norm: evict-first leaves L2 to the output, which attention reads
        # next (Flux-sized q, affine: 15.6 -> 14.7 µs; H200, one run)
        x = to_fp32(gl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first"))
        even, odd = gl.split(gl.reshape(x, [ROWS, 32, 2, 2]))  # entries (0, 2) and (1, 3)
        x0, x2 = gl.split(even)
        x1, x3 = gl.split(odd)
        # the same layout under another name: no data moves
        x0, x1 = gl.convert_layout(x0, LANES), gl.convert_layout(x1, LANES)
        x2, x3 = gl.convert_layout(x2, LANES), gl.convert_layout(x3, LANES)
        # counts from the columns alone (a row past M is never stored)
        mean, m2, n = vector_welford(x0, x1, x2, x3, lane_active, gl.zeros([ROWS, 32], gl.float32, LANES))
        # ATen's thread l = 16 hi + 8 lo + t: offset 16 pairs hi, then offset 8 pairs lo
        mean = gl.reshape(mean, [ROWS, 2, 2, 8])
        m2 = gl.reshape(m2, [ROWS, 2, 2, 8])
        n = gl.reshape(n, [ROWS, 2, 2, 8])
        mean, m2, n = _fold_last_axis(gl.permute(mean, [0, 2, 3, 1]), gl.permute(m2, [0, 2, 3, 1]),
                                      gl.permute(n, [0, 2, 3, 1]), POW2)
        mean, m2, n = _fold_last_axis(gl.permute(mean, [0, 2, 1]), gl.permute(m2, [0, 2, 1]),
                                      gl.permute(n, [0, 2, 1]), POW2)
        if POW2:
            mean, m2, n = gl.reduce((mean, m2, n), 1, welford_combine_pow2)
        else:
            mean, m2, n = gl.reduce((mean, m2, n), 1, welford_combine)
        mean, m2, n = _row_lane0(mean), _row_lane0(m2), _row_lane0(n)
        mean, m2, n = fold_empty_warps(mean, m2, n, gl.zeros_like(mean), POW2)
        ROW: gl.constexpr = gl.SliceLayout(1, LANES)
        mean, m2 = gl.convert_layout(mean, ROW), gl.convert_layout(m2, ROW)  # the same layout
        if POW2:  # m2 / N with N a power of two: the product with 1 / N, rounded alike
            var = m2 * pow2_reciprocal(gl.full(m2.shape, N, gl.float32, ROW))
        else:
            var = gl.div_rn(m2, gl.full(m2.shape, N, gl.float32, ROW))
        rstd = rsqrtf(var + eps, INTERPRET)
        y = _normalize(x, mean[:, None, None], rstd[:, None, None], w_ptr, b_ptr, col, mask, HAS_WEIGHT, HAS_BIAS)
        gl.store(out_ptr + offs, y.to(DTYPE).to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _warp_lane0(v):
        """Every lane of the warp takes lane 0's value."""
        return gl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, 0, 0x1f, -1;", "=r,r", [v],
                                         dtype=gl.float32, is_pure=True, pack=1)

    @gluon.constexpr_function
    def _lane_xor_asm(offset):
        return f"shfl.sync.bfly.b32 $0, $1, {offset}, 0x1f, -1;"

    @gluon.jit
    def _lane_xor(v, OFFSET: gl.constexpr):
        """Every lane takes lane ``lane ^ OFFSET``'s value (fp32, one shuffle a register)."""
        return gl.inline_asm_elementwise(_lane_xor_asm(OFFSET), "=r,r", [v], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.constexpr_function
    def _tree_term(tree, level, a, b, i):
        return tree[level][a][b][i]

    @gluon.jit
    def _known_combine(own_mean, own_m2, oth_mean, oth_m2, b0, TREE: gl.constexpr, LEVEL: gl.constexpr,
                       A: gl.constexpr):
        """welford_combine of ATen warp (A, b)'s states at one level of the tree, its count terms
        compiled in (``TREE``: :func:`warp_row_tree_terms`); ``b0``: the lanes of b = 0."""
        n_a = gl.where(b0, _tree_term(TREE, LEVEL, A, 0, 0), _tree_term(TREE, LEVEL, A, 1, 0))
        n_b = gl.where(b0, _tree_term(TREE, LEVEL, A, 0, 1), _tree_term(TREE, LEVEL, A, 1, 1))
        oth_n = gl.where(b0, _tree_term(TREE, LEVEL, A, 0, 2), _tree_term(TREE, LEVEL, A, 1, 2))
        nonempty = gl.where(b0, _tree_term(TREE, LEVEL, A, 0, 3), _tree_term(TREE, LEVEL, A, 1, 3))
        return combine_with_terms(own_mean, own_m2, oth_mean, oth_m2, n_a, n_b, oth_n, nonempty)

    @gluon.jit
    def _by_warp_and_hi(v, ROWS: gl.constexpr):
        """A ``[rows, 128]`` tile of ATen's threads (l = 64 a + 32 b + 16 hi + lo) as its four
        ``[rows, b, lo]`` parts ``((a0 hi0, a0 hi1), (a1 hi0, a1 hi1))``: a and hi are a
        thread's registers, so no data moves."""
        v = gl.permute(gl.reshape(v, [ROWS, 2, 2, 2, 16]), [0, 2, 4, 1, 3])  # [row, b, lo, a, hi]
        hi0, hi1 = gl.split(v)
        a0hi0, a1hi0 = gl.split(hi0)
        a0hi1, a1hi1 = gl.split(hi1)
        return (a0hi0, a0hi1), (a1hi0, a1hi1)

    @gluon.jit
    def _as_threads(v, ROWS: gl.constexpr, LANES: gl.constexpr):
        """A ``[rows, b, lo]`` value every lane of a row's warp holds alike, as a ``[rows, 128]`` tile."""
        v = gl.join(v, v)
        v = gl.permute(gl.join(v, v), [0, 3, 1, 4, 2])  # [row, a, b, hi, lo]
        return gl.convert_layout(gl.reshape(v, [ROWS, THREADS_C]), LANES)

    @gluon.jit
    def _warp_row_stats(mean, m2, l, eps, N: gl.constexpr, TREE: gl.constexpr, LANES: gl.constexpr,
                        INTERPRET: gl.constexpr):
        """Mean and rstd of each row from ATen's 128 threads' Welford states (``[rows, 128]``,
        l = 64 a + 32 b + 16 hi + lo; lane 16 b + lo holds a, hi in registers), as
        ``[rows, 128]`` tiles.

        ATen's tree in its order: offset 16 pairs registers (hi); offsets 8 to 1 are butterfly
        shuffles over the 16 lanes of lo, each lane combining (own, other), so that lane 0
        follows shuffle-down's path; the cross-warp steps 0 <- 2, 1 <- 3 pair registers (a),
        and 0 <- 1 is a shuffle at offset 16 (b). Lane 0 ends with ATen's state and every lane
        takes it. The counts on lane 0's path are known from N, so each combine's terms are
        constants (other lanes combine garbage that never reaches lane 0): no count is
        shuffled, no reciprocal taken."""
        ROWS: gl.constexpr = mean.shape[0]
        b0 = _by_warp_and_hi(gl.zeros_like(mean) + (l[None, :] // 32 % 2 == 0).to(gl.float32), ROWS)[0][0] != 0.0
        means, m2s = _by_warp_and_hi(mean, ROWS), _by_warp_and_hi(m2, ROWS)
        warps = ()
        for a in gl.static_range(2):
            mu, v = _known_combine(means[a][0], m2s[a][0], means[a][1], m2s[a][1], b0, TREE, 0, a)  # offset 16
            for level in gl.static_range(1, 5):  # offsets 8, 4, 2, 1
                mu, v = _known_combine(mu, v, _lane_xor(mu, 16 >> level), _lane_xor(v, 16 >> level), b0, TREE, level, a)
            warps = warps + ((mu, v),)
        mu, v = _known_combine(warps[0][0], warps[0][1], warps[1][0], warps[1][1], b0, TREE, 5, 0)  # 0 <- 2, 1 <- 3
        mu, v = _known_combine(mu, v, _lane_xor(mu, 16), _lane_xor(v, 16), b0, TREE, 6, 0)  # warps 0 <- 1
        mu, v = _warp_lane0(mu), _warp_lane0(v)
        rstd = rsqrtf(gl.div_rn(v, gl.full(v.shape, N, gl.float32, v.type.layout)) + eps, INTERPRET)
        return _as_threads(mu, ROWS, LANES), _as_threads(rstd, ROWS, LANES)

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
        # otherwise (Sana: 96 -> 128 registers, 5.5 -> 5.8 µs on an H200, one run)
        xs, ws, bs, scs, shs = (), (), (), (), ()
        for step in gl.static_range(-1, ITERS):  # step -1: the statistics, after the loads EARLY sends
            for k in gl.static_range(ITERS):
                if _load_step(k, GROUP, AHEAD, EARLY) == step:
                    col, mask = _warp_row_tile(l, j, k, row_ok, N, EVEN_ROWS)
                    if _full_tile(k, N, EVEN_ROWS):
                        mask = None
                    # keeping the row converted to fp32 doubled the registers and was slower (PixArt
                    # 14.2 -> 18.4 µs, before N was compiled in)
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
                    y = _affine(rstd[:, :, None] * centered, rstd[:, :, None], centered,
                                to_fp32(ws[k]) if HAS_WEIGHT else None, to_fp32(bs[k]) if HAS_BIAS else None)
                    y = _modulate(y.to(DTYPE), scs[k] if HAS_SCALE else None, shs[k] if HAS_SHIFT else None,
                                  PLUS_ONE, HAS_SCALE, HAS_SHIFT, DTYPE)
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

    @functools.lru_cache(maxsize=None)
    def warp_rows_layout(rows: int, warps: int):
        """The ``[rows, 32, 4]`` tile (row, ATen thread l, vector entry j) of
        :func:`_layer_norm_warp_rows_kernel`: j and l's bits 3-4 in a thread's registers, l's
        bits 0-2 across a segment of 8 lanes, 4 rows a warp (lane bits 3-4), then rows across
        warps and registers. ``rows`` a multiple of 4 * warps, both powers of two."""
        assert rows % (4 * warps) == 0 and rows & (rows - 1) == 0 and warps & (warps - 1) == 0
        reg = [[0, 0, 1], [0, 0, 2], [0, 8, 0], [0, 16, 0]]
        reg += [[4 * warps << k, 0, 0] for k in range((rows // (4 * warps)).bit_length() - 1)]
        lane = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0]]
        warp = [[4 << k, 0, 0] for k in range(warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [rows, 32, 4])

    def warp_rows_options(M: int, N: int, rows: int, warps: int) -> dict:
        """The launch options of :func:`_layer_norm_warp_rows_kernel` for M rows of N and this
        program shape."""
        lanes = N // VEC
        return dict(ROWS=rows, LAYOUT=warp_rows_layout(rows, warps), POW2=lanes & (lanes - 1) == 0,
                    EVEN_ROWS=M % rows == 0, num_warps=warps)
else:
    _layer_norm_warp_rows_kernel = warp_rows_options = None
    _layernorm_modulate_warp_row_kernel = warp_row_layout = None


def can_use(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None) -> bool:
    """Inputs on which eager takes ATen's vectorized LayerNorm and every operand is one dtype."""
    return x.is_cuda and supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype)


def supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not _norm_ok(x, weight, bias, x_dtype, out_dtype):
        return False
    for p in (scale, shift):
        if p is not None and (p.dtype != (x_dtype or x.dtype) or p.device != x.device or p.dim() > x.dim()):
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
    if n % VEC or n > 2**24 or x.stride(-1) != 1:
        return False
    # eager normalizes x.contiguous(): a copy (aligned) when x is strided, else x itself (or
    # the fresh tensor of its cast)
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
def _plan(x, scale, shift):
    shape = (1, *x.shape) if x.dim() == 2 else tuple(x.shape)
    B, S, N = shape
    x3 = x.view(shape)
    sc_strides = scale.expand(shape).stride() if scale is not None else (0, 0, 0)
    sh_strides = shift.expand(shape).stride() if shift is not None else (0, 0, 0)
    return shape, (B * S,), (S, N, x3.stride(0), x3.stride(1), *sc_strides, *sh_strides), \
        triton.cdiv(N // VEC, THREADS)


WARP_ROW_ITERS = 6  # _warp_row: rows of at most this many vectors a thread


def _warp_row(N: int, iters: int) -> bool:
    """Rows of at most 6 vectors a thread take the warp-row kernel, where N % 64 == 0 (every
    real model's: the counts on its tree's path are then known, see :func:`warp_row_tree_terms`;
    other rows take the 4-warp kernel). There the 4-warp kernel is bound by its instructions'
    issue, a third of them the four warps' shuffle trees. Measured on an H200 (one run, both
    kernels with the row length compiled in): PixArt 18.6 -> 10.6 µs, Sana 7.0 -> 6.1, Wan 2.1
    1.3B's 32760 rows of 1536 66.1 -> 52.7, Flux 18.1 -> 17.9. On Wan-14B's rows of 10 vectors
    it is slower (bf16 189 -> 223, fp32 327 -> 465): a row's registers a thread, four times the
    4-warp kernel's, cost more than the instructions saved."""
    return iters <= WARP_ROW_ITERS and N % 64 == 0


FEW_ROWS, SHORT_ITERS = 8192, 5  # _keep_row: at most this many rows of at most this many vectors a thread


def _keep_row(x, rows: int, iters: int) -> bool:
    """The 4-warp kernel (long rows, or a Triton without Gluon) normalizes the row from
    registers rather than reading it again. Measured on an H200: it pays where the second read
    is costly (x fp32 in memory: Wan-14B's rows of 5120, 404 -> 328 µs) and where a grid of
    few, short rows is latency-bound (Sana, PixArt: 0.3 to 1 µs); with many bf16 rows or more
    than 5 vectors a thread the registers it takes cost more (Wan-14B bf16 +20 µs, Flux
    affine +2 µs)."""
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
    register cap. Measured on an H200:

    - a row whose grid is resident at once is kept in registers (Sana affine 6.5 -> 5.9 µs:
      nothing overlaps the second pass, its five loads a vector are the kernel's tail), with S at
      run time: compiled in, ptxas spreads each tile's loads (6.0 -> 7.1). Each tile's loads go
      out one tile ahead of the stores, at most 128 registers a thread so that the grid stays one
      wave (Sana affine 5.77 -> 5.64, three runs: 1-3%). The first tiles' loads also go out
      before the statistics, two without an affine LayerNorm (Sana 5.36 -> 5.19, fp16 5.35 ->
      5.18; the row read again instead, 5.35), one with it (5.67-5.75 -> 5.50-5.58 in three
      processes; two spill at the cap, 5.95): ptxas then issues them among the tree's shuffles
      rather than after it. Rows of 6 vectors a thread spill at that cap: they keep
      the earlier way (affine: tile by tile; otherwise read again, below). Not kept: the affine
      row read again, grouped (6.1) or one or two tiles ahead (5.7); the kept row and four
      operands a tile grouped take more than 128 registers (6.9); two rows a warp, 13% fewer
      instructions a row (6.25); the weight and bias widened once a program of 4 to 16 warps in
      shared memory, 8% fewer (6.4-10.8);
    - otherwise the row is read again with S compiled in and, where an SM holds at most 64 rows,
      the tiles' loads grouped: all of them for rows of up to 5 vectors a thread, two at a time
      for Flux's 6 unless affine (all: 18.5, and affine 19.2 -> 24.9). Against tile by tile with
      S at run time, one run: Sana 5.8 -> 5.55, fp16 5.9 -> 5.45, PixArt 9.15 -> 8.35 (affine
      10.8 -> 10.2, fp16 9.2 -> 8.5), Flux 17.7 -> 16.9 (affine 19.1 -> 19.0, fp16 17.5 -> 16.7).
      Where rows take many waves (Wan 2.1 1.3B) grouped loads cost more registers than the
      latency they hide (52.2 -> 53.7): tile by tile."""
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


def _bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, device=None):
    """The launch for inputs of this signature: ``launch(x, weight, bias, scale, shift)``; ``device``
    where x stands in (meta) for the rows."""
    shape, grid, ints, iters = _plan(x, scale, shift)
    rows, N = grid[0], shape[-1]
    dtype = x_dtype or x.dtype
    out_dtype, view = out_dtype or dtype, x.shape
    options = dict(ITERS=iters, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                   HAS_SHIFT=shift is not None, PLUS_ONE=scale_plus_one, DTYPE=TL_DTYPE[dtype], INTERPRET=INTERPRET,
                   HAS_SCALE=scale is not None, enable_fp_fusion=False)

    def bind_gluon():
        per, warps = WARP_ROW_PROGRAM
        second_pass = _warp_row_second_pass(rows, shape[1], iters, weight is not None, device or x.device)
        return _layernorm_modulate_warp_row_kernel.bound(
            (triton.cdiv(rows, per),), ROWS=per, LAYOUT=warp_row_layout(per, warps), EVEN_ROWS=rows % per == 0,
            TREE=warp_row_tree_terms(N), **second_pass, num_warps=warps, **options)

    def bind_triton():
        keep = _keep_row(x, rows, iters)
        # the tiles' loads grouped where the row is read again (Wan-14B 188.5 -> 166.8 µs, affine 179 ->
        # 171.6, fp16 190.7 -> 168.7; H200, one run); kept (fp32 rows), the row's registers leave too few
        # for them (326.4 -> 327.3)
        return _layernorm_modulate_kernel.bound(grid, KEEP_ROW=keep, GROUP=1 if keep else iters, num_warps=4,
                                                **options)

    warp_row = _layernorm_modulate_warp_row_kernel is not None and _warp_row(N, iters)
    kernel = _gluon_or_triton(bind_gluon if warp_row else None, bind_triton,
                              f"layernorm_modulate's Gluon kernel for rows of {N}")

    def launch(x, weight, bias, scale, shift):
        out = torch.empty(view, dtype=out_dtype, device=x.device)  # the kernel takes pointers: no view
        scale_arg = scale if scale is not None else x
        kernel(x, weight if weight is not None else x, bias if bias is not None else x,
               scale_arg, shift if shift is not None else scale_arg, out, *ints, eps, rows)
        return out

    return launch


def bind(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None):
    """:func:`layernorm_modulate` for inputs of this signature, its host arithmetic done."""
    launch = _bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype)
    return lambda x, weight, bias, eps, scale, shift, *_: launch(x, weight, bias, scale, shift)


def layernorm_modulate(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None):
    """Launch; the caller has checked :func:`can_use`."""
    return _bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype)(x, weight, bias, scale, shift)


# --- sgdiff::layer_norm: the same kernel without the modulation ---------------------------

SHORT_ROW = THREADS  # rows up to one warp's 4-vectors (head_dim <= 128) take the short-rows kernel
SHORT_ROWS_PER_PROGRAM = 16
WARP_ROWS_PROGRAM = (16, 2)  # the Gluon kernel's rows a program and warps (4 rows a warp), as measured


def layer_norm_supported_layout(x, weight, bias, eps, x_dtype=None, out_dtype=None) -> bool:
    """can_use without the device check: rows of any leading shape, normalized as eager
    normalizes ``x.contiguous()``."""
    if not (x.dim() >= 1 and x.numel() > 0 and isinstance(eps, float)):
        return False
    shape = (x.numel() // x.shape[-1], x.shape[-1])
    rows = x.view(shape) if x.is_contiguous() else torch.empty(shape, dtype=x.dtype, device="meta")  # eager's copy
    return _norm_ok(rows, weight, bias, x_dtype, out_dtype, x.device)


def layer_norm_can_use(x, weight, bias, eps, x_dtype=None, out_dtype=None) -> bool:
    return x.is_cuda and layer_norm_supported_layout(x, weight, bias, eps, x_dtype, out_dtype)


def layer_norm_bind(x, weight, bias, eps, x_dtype=None, out_dtype=None):
    """:func:`layer_norm` for inputs of this signature, its host arithmetic done. A strided
    ``x`` is copied contiguous first, as eager's kernel does (in x's dtype: widening it later
    is exact)."""
    shape, view = (x.numel() // x.shape[-1], x.shape[-1]), x.shape
    M, N = shape
    if N > SHORT_ROW:
        rows = torch.empty(shape, dtype=x.dtype, device="meta")  # the geometry of x.contiguous() as rows
        launch = _bind(rows, weight, bias, eps, None, None, False, x_dtype, out_dtype, x.device)
        return lambda x, weight, bias, *_: launch(x.contiguous(), weight, bias, None, None).view(view)
    dtype = x_dtype or x.dtype
    out_dtype = out_dtype or dtype
    options = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, DTYPE=TL_DTYPE[dtype],
                   INTERPRET=INTERPRET, enable_fp_fusion=False)

    def bind_gluon():
        program = warp_rows_options(M, N, *WARP_ROWS_PROGRAM)
        return _layer_norm_warp_rows_kernel.bound((triton.cdiv(M, program["ROWS"]),), **program, **options)

    def bind_triton():
        return _layer_norm_short_rows_kernel.bound((triton.cdiv(M, SHORT_ROWS_PER_PROGRAM),),
                                                   ROWS=SHORT_ROWS_PER_PROGRAM, num_warps=4, **options)

    kernel = _gluon_or_triton(bind_gluon if _layer_norm_warp_rows_kernel is not None else None, bind_triton,
                              f"layer_norm's Gluon kernel for rows of {N}")

    def launch(x, weight, bias, *_):
        rows = x.contiguous()  # the kernel takes pointers: no views
        out = torch.empty(view, dtype=out_dtype, device=x.device)
        kernel(rows, weight if weight is not None else rows, bias if bias is not None else rows, out, M, N, eps)
        return out

    return launch


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


def layer_norm(x, weight, bias, eps, x_dtype=None, out_dtype=None):
    """Launch; the caller has checked :func:`layer_norm_can_use`."""
    return layer_norm_bind(x, weight, bias, eps, x_dtype, out_dtype)(x, weight, bias)


layernorm_modulate.can_use, layernorm_modulate.bind = can_use, bind
layer_norm.can_use, layer_norm.bind = layer_norm_can_use, layer_norm_bind
