"""ATen's LayerNorm statistics, reproduced step for step in Triton.

PyTorch's ``vectorized_layer_norm_kernel`` (aten/src/ATen/native/cuda/layer_norm_kernel.cu)
computes a row's mean and variance with one block of 128 threads (32 x 4 warps):

1. thread ``t`` reads 4-element vectors ``t, t + 128, t + 256, ...`` of the row and folds each
   element into a serial Welford state (``cuWelfordOnlineSum``)::

       delta = x - mean;  count += 1
       mean  = fma(delta, 1 / count, mean)           # 1/count correctly rounded
       m2    = fma(delta, x - mean, m2)

2. a warp folds its 32 states with shuffle-down (offsets 16, 8, 4, 2, 1), each lane combining
   its own state with the one ``offset`` lanes above (``cuWelfordCombine``; idle lanes with
   count 0 still take part: no shortcut for an empty partner)::

       delta = own.mean - other.mean;  n = other.n + own.n;  c = 1 / n
       mean  = fma(other.n * c, other.mean, (own.n * c) * own.mean)
       m2    = fma(delta * delta * other.n, own.n * c, other.m2 + own.m2)

3. warps combine through shared memory, (0 <- 2, 1 <- 3), then (0 <- 1);
   ``var = m2 / N`` (IEEE division), ``rstd = rsqrtf(var + eps)`` (the approximate rsqrt).

The 128 "threads" here are the elements of a [128] tensor held one per thread by a 4-warp
program; ``tl.reduce`` over it runs the same shuffle tree (checked bitwise on an H200; a
combine with swapped operands is not exact, so the order is what it looks like). nvcc
contracts ``a * b + c`` into FMAs; these kernels are compiled with ``enable_fp_fusion=False``
and write each FMA explicitly.

The Gluon kernels (sgdiff::layer_norm's per-head rows, sgdiff::layernorm_modulate's row a warp)
lay ATen's threads out in a layout of their own, several a lane; the Gluon helpers at the end
take ATen's tree over those lanes and registers in its order.
"""
import functools

import numpy as np
import torch
import triton
import triton.language as tl

from sgdiff.kernels.triton.cuda_math import count_reciprocal, rsqrtf, to_fp32
from sgdiff.kernels.triton.rows import halves

try:  # Triton's layout-explicit dialect (triton >= 3.5); not run by the interpreter
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:
    gluon = None


THREADS = 128  # ATen: 32 x 4 threads per row
VEC = 4  # ATen's vec_size for every dtype
THREADS_C = tl.constexpr(THREADS)  # the same, for use inside @triton.jit code
VEC_C = tl.constexpr(VEC)


def aligned_vec4(t: torch.Tensor) -> bool:
    """ATen's vectorized LayerNorm/RMSNorm path needs each pointer to hold an aligned_vector<T, 4>."""
    return t.data_ptr() % (VEC * t.element_size()) == 0


@triton.jit
def welford_combine(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n):
    """cuWelfordCombine(dataB=own, dataA=other), as nvcc compiles it."""
    coef = count_reciprocal(oth_n + own_n)  # 1.f / count: IEEE
    return _combine_by(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n, coef)


@triton.jit
def welford_combine_pow2(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n):
    """:func:`welford_combine` where the combined count is 0 or a power of two, as on lane 0's
    path when a row's active lanes are a power of two (N = 4 * 2**k): ``1 / 2**e`` read off the
    count's bits (exactly what IEEE division gives) instead of dividing. (A count of 0 gives
    2**127, not inf; its combine is empty either way.)"""
    return _combine_by(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n, pow2_reciprocal(oth_n + own_n))


@triton.jit
def _combine_by(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n, coef):
    """The combine, ``coef`` being 1 / (own_n + oth_n)."""
    n = oth_n + own_n
    mean, m2 = combine_with_terms(own_mean, own_m2, oth_mean, oth_m2, oth_n * coef, own_n * coef, oth_n, n > 0.0)
    return mean, m2, n


@triton.jit
def combine_with_terms(own_mean, own_m2, oth_mean, oth_m2, n_a, n_b, oth_n, nonempty):
    """cuWelfordCombine given its count terms ``n_a = oth_n / n``, ``n_b = own_n / n`` (each a
    product with the rounded ``1 / n``) and ``nonempty = n > 0``: computed, or known up front
    (:func:`known_combine_terms`)."""
    delta = own_mean - oth_mean
    mean = tl.fma(n_a, oth_mean, n_b * own_mean)
    m2 = tl.fma(delta * delta * oth_n, n_b, oth_m2 + own_m2)
    return tl.where(nonempty, mean, 0.0), tl.where(nonempty, m2, 0.0)


def known_combine_terms(own_n: int, oth_n: int) -> tuple:
    """``(n_a, n_b, oth_n, nonempty)`` of a combine of states holding these counts, the bits
    :func:`welford_combine` computes (fp32 arithmetic: ``1 / n``, then its products). Two
    empty states: zeros (their combine is empty)."""
    own, oth = np.float32(own_n), np.float32(oth_n)
    if own_n + oth_n == 0:
        return 0.0, 0.0, 0.0, False
    coef = np.float32(1.0) / (own + oth)
    return float(oth * coef), float(own * coef), float(oth), True


@functools.lru_cache(maxsize=None)
def warp_row_tree_terms(N: int) -> tuple:
    """The count terms of every combine that reaches lane 0 in ATen's tree for a row of ``N``
    (:func:`known_combine_terms`), where they do not depend on the lane within a half-warp
    (N % 64 == 0: the row's last, partial 128-thread tile ends on a multiple of 16 threads).

    ATen's thread ``l = 32 w + t`` (warp w = 2 a + b, lane t = 16 hi + lo) counts 4 elements
    for each of its vectors ``l + 128 k`` in the row. Levels, as ``terms[level][a][b]``:
    0, shuffle-down offset 16 (hi = 0 <- hi = 1); 1 to 4, offsets 8, 4, 2, 1 (lane lo <-
    lo + offset: equal counts); 5, warps 0 <- 2 and 1 <- 3 (a = 0 <- a = 1, listed for both
    a); 6, warp 0 <- 1 (b = 0 <- b = 1, listed for every a and b)."""
    assert N % 64 == 0, N
    n_vec = N // VEC
    iters = -(-n_vec // THREADS)
    count = [VEC * sum(1 for k in range(iters) if l + THREADS * k < n_vec) for l in range(THREADS)]
    warp = [[count[64 * a + 32 * b] + count[64 * a + 32 * b + 16] for b in range(2)] for a in range(2)]
    levels = [[[known_combine_terms(count[64 * a + 32 * b], count[64 * a + 32 * b + 16]) for b in range(2)]
               for a in range(2)]]
    for level in range(4):  # a warp's lanes lo and lo + offset hold 2**level states of one count each
        levels.append([[known_combine_terms(warp[a][b] << level, warp[a][b] << level) for b in range(2)]
                       for a in range(2)])
    warp = [[16 * warp[a][b] for b in range(2)] for a in range(2)]  # a warp's count
    cross = [known_combine_terms(warp[0][b], warp[1][b]) for b in range(2)]
    levels.append([cross, cross])
    last = known_combine_terms(warp[0][0] + warp[1][0], warp[0][1] + warp[1][1])
    levels.append([[last, last], [last, last]])
    return tuple(tuple(tuple(terms) for terms in level) for level in levels)


@triton.jit
def load_row(row_ptr, n_vec, ITERS: tl.constexpr):
    """The ``ITERS`` ``[128, 4]`` tiles of a row of ``4 * n_vec`` elements (thread ``t``'s
    vectors ``t + 128 k``; zeros past the end), every load issued before any is used."""
    t = tl.arange(0, THREADS_C)
    lane = tl.arange(0, VEC_C)
    vecs = ()
    for k in tl.static_range(ITERS):
        v = t + k * THREADS_C
        vecs = vecs + (tl.load(row_ptr + v[:, None] * VEC_C + lane[None, :], mask=(v < n_vec)[:, None], other=0.0),)
    return vecs


@triton.jit
def row_welford(vecs, n_vec, ITERS: tl.constexpr):
    """Mean, m2 and count of one row of ``4 * n_vec`` elements held as :func:`load_row`'s
    tiles, in ATen's vectorized order (``ITERS`` = ceil(n_vec / 128)).

    Thread ``t`` takes vectors ``t + 128 k``; its count before element ``4k + j`` is exactly
    ``4k + j``, so ``1 / count`` is known up front (fp32-rounded: equal to the correctly
    rounded division for every count below 2**17).
    """
    t = tl.arange(0, THREADS_C)
    zero = tl.zeros((THREADS_C,), tl.float32)
    mean, m2, n = zero, zero, zero
    for k in tl.static_range(ITERS):
        mean, m2, n = fold_vector(mean, m2, n, unpack4(to_fp32(vecs[k])), t + k * THREADS_C < n_vec, k, ITERS)
    # One element per thread (128 threads, 4 warps): Triton reduces with a shuffle tree over
    # lanes (16, 8, 4, 2, 1), the combine taking (own, other), then across warps through
    # shared memory the same way. Lane 0 of that tree folds exactly what ATen's does.
    return tl.reduce((mean, m2, n), 0, welford_combine)


@triton.jit
def fold_vector(mean, m2, n, xs, active, k: tl.constexpr, ITERS: tl.constexpr):
    """Each thread's Welford state after folding in its k-th 4-vector (``xs``: its four fp32
    entries as tiles; ``active``: the threads whose vector lies in the row).

    Only the last vectors (k = ITERS - 1) can lie past the row's end, where a thread keeps its
    state; at k = 0 an idle thread loads zeros and its state stays +0 (see vector_welford)."""
    for j in tl.static_range(4):
        mean, m2 = _online(mean, m2, xs[j], active, 1.0 / (4 * k + j + 1), k > 0 and k == ITERS - 1)
    return mean, m2, tl.where(active, n + 4.0, n)


@triton.jit
def short_rows_welford(x, active):
    """Mean, m2 and count of each row of a ``[R, 32, 4]`` tile (lane ``t`` holds vector ``t``)
    of rows no longer than one warp's vectors (N <= 128), in ATen's order.

    ATen gives such a row a whole 128-thread block in which only warp 0 holds data: warp 0's
    shuffle-down tree, then the cross-warp steps 0 <- 2 and 0 <- (1 <- 3), which fold in
    empty states. Those still round (the mean becomes ``(n * (1/n)) * mean``), so they are
    taken here too; R rows share one program instead of one row per 4 warps."""
    x0, x1, x2, x3 = unpack4(x)
    mean, m2, n = vector_welford(x0, x1, x2, x3, active, tl.zeros(x0.shape, tl.float32))
    # Shuffle-down offsets 16, 8, 4, 2, 1: lane i folds in lane i + offset (own, other). Halving
    # the lane axis each level takes exactly lane 0's path, one combine per pair (tl.reduce's
    # order over this tile is Triton's to choose, and it combines every lane at every level).
    for level in tl.static_range(5):
        mean_own, mean_oth = halves(mean)
        m2_own, m2_oth = halves(m2)
        n_own, n_oth = halves(n)
        mean, m2, n = welford_combine(mean_own, m2_own, n_own, mean_oth, m2_oth, n_oth)
    R: tl.constexpr = mean.shape[0]
    mean, m2, n = tl.reshape(mean, (R,)), tl.reshape(m2, (R,)), tl.reshape(n, (R,))
    return fold_empty_warps(mean, m2, n, tl.zeros(mean.shape, tl.float32))


@triton.jit
def vector_welford(x0, x1, x2, x3, active, zero):
    """Each lane's Welford state over its 4-vector ``(x0, x1, x2, x3)`` (fp32 tiles of one
    shape, ``zero`` a zero tile of it): counts 1 to 4, idle lanes left empty.

    An idle lane's elements are loaded as 0, so its state stays (+0, +0) without a select:
    ``0 - 0``, ``fma(0, c, 0)`` and ``fma(0, 0 - 0, 0)`` are all +0."""
    mean, m2 = _online_step(zero, zero, x0, 1.0)
    mean, m2 = _online_step(mean, m2, x1, 1.0 / 2)
    mean, m2 = _online_step(mean, m2, x2, 1.0 / 3)
    mean, m2 = _online_step(mean, m2, x3, 1.0 / 4)
    return mean, m2, tl.where(active, 4.0, 0.0)


@triton.jit
def fold_empty_warps(mean, m2, n, empty, POW2: tl.constexpr = False):
    """ATen's cross-warp steps for a row held by warp 0 alone: 0 <- 2, then 0 <- (1 <- 3),
    each a combine with an empty state (``empty``: zeros), which still rounds. ``POW2``: the
    row's count is 0 or a power of two (:func:`welford_combine_pow2`)."""
    if POW2:
        mean, m2, n = welford_combine_pow2(mean, m2, n, empty, empty, empty)  # warp 0 <- warp 2
        return welford_combine_pow2(mean, m2, n, empty, empty, empty)  # warp 0 <- (warp 1 <- warp 3)
    else:
        mean, m2, n = welford_combine(mean, m2, n, empty, empty, empty)
        return welford_combine(mean, m2, n, empty, empty, empty)


@triton.jit
def pow2_reciprocal(n):
    """``1 / n`` for n a power of two (2**127 for 0), read off n's bits: IEEE division's result."""
    return (0x7F000000 - n.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def unpack4(vec):
    """The four entries of the last axis (size 4) of a tile, in order, as tiles without it."""
    pairs = tl.reshape(vec, vec.shape[:-1] + [2, 2])
    even, odd = tl.split(pairs)  # entries (0, 2) and (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _online_step(mean, m2, x, inv_count):
    """cuWelfordOnlineSum."""
    delta = x - mean
    new_mean = tl.fma(delta, inv_count, mean)
    return new_mean, tl.fma(delta, x - new_mean, m2)


@triton.jit
def _online(mean, m2, x, active, inv_count, MASKED: tl.constexpr):
    """cuWelfordOnlineSum; ``MASKED``: for lanes that hold an element (``active``) only."""
    new_mean, new_m2 = _online_step(mean, m2, x, inv_count)
    if MASKED:
        return tl.where(active, new_mean, mean), tl.where(active, new_m2, m2)
    return new_mean, new_m2


@triton.jit
def aten_affine(y, rstd, centered, w, b):
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


@triton.jit
def modulate_rounded(y, sc, sh, PLUS_ONE: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
                     DTYPE: tl.constexpr):
    """The adaLN chain after a norm, ``y * (1 + scale) + shift`` on its output ``y`` (DTYPE),
    each step in fp32 and rounded to DTYPE as eager's (``PLUS_ONE=False``: ``y * scale``)."""
    if HAS_SCALE:
        f = sc.to(tl.float32)
        if PLUS_ONE:
            f = (f + 1.0).to(DTYPE).to(tl.float32)
        y = (y.to(tl.float32) * f).to(DTYPE)
    if HAS_SHIFT:
        y = (y.to(tl.float32) + sh.to(tl.float32)).to(DTYPE)
    return y


# --- Gluon: ATen's tree over the lanes and registers of a layout written out ------------

if gluon is not None:
    # sgdiff::layer_norm's per-head rows, a row an 8-lane segment

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

    # sgdiff::layernorm_modulate's row a warp: ATen's 128 threads in a warp's lanes and registers

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
else:
    _row_lane0 = _fold_last_axis = _warp_row_stats = None
