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
   count 0 still take part)::

       delta = own.mean - other.mean;  n = other.n + own.n;  c = 1 / n
       mean  = fma(other.n * c, other.mean, (own.n * c) * own.mean)
       m2    = fma(delta * delta * other.n, own.n * c, other.m2 + own.m2)

3. warps combine through shared memory, (0 <- 2, 1 <- 3), then (0 <- 1);
   ``var = m2 / N`` (IEEE division), ``rstd = rsqrtf(var + eps)`` (the approximate rsqrt).

The 128 "threads" here are the lanes of a [128] tensor; the shuffle tree is a sequence of
reshape-and-split halvings, which is the same tree. nvcc contracts ``a * b + c`` into FMAs;
these kernels are compiled with ``enable_fp_fusion=False`` and write each FMA explicitly.
"""
import triton
import triton.language as tl

THREADS = 128  # ATen: 32 x 4 threads per row
VEC = 4  # ATen's vec_size for every dtype
THREADS_C = tl.constexpr(THREADS)  # the same, for use inside @triton.jit code
VEC_C = tl.constexpr(VEC)


@triton.jit
def welford_combine(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n):
    """cuWelfordCombine(dataB=own, dataA=other), as nvcc compiles it."""
    delta = own_mean - oth_mean
    n = oth_n + own_n
    coef = tl.math.div_rn(tl.full(n.shape, 1.0, tl.float32), n)
    n_a = oth_n * coef
    n_b = own_n * coef
    mean = tl.fma(n_a, oth_mean, n_b * own_mean)
    m2 = tl.fma(delta * delta * oth_n, n_b, oth_m2 + own_m2)
    nonempty = n > 0.0
    return tl.where(nonempty, mean, 0.0), tl.where(nonempty, m2, 0.0), n


@triton.jit
def _halve(mean, m2, n, LEAD: tl.constexpr, HALF: tl.constexpr):
    """Lanes [0, HALF) combine with lanes [HALF, 2*HALF): one shuffle-down step."""
    own_mean, oth_mean = tl.split(tl.permute(tl.reshape(mean, (LEAD, 2, HALF)), (0, 2, 1)))
    own_m2, oth_m2 = tl.split(tl.permute(tl.reshape(m2, (LEAD, 2, HALF)), (0, 2, 1)))
    own_n, oth_n = tl.split(tl.permute(tl.reshape(n, (LEAD, 2, HALF)), (0, 2, 1)))
    return welford_combine(own_mean, own_m2, own_n, oth_mean, oth_m2, oth_n)


@triton.jit
def block_welford_reduce(mean, m2, n):
    """Fold 128 per-thread states ([128] tensors) in ATen's order; returns [1, 1] tensors."""
    # intra-warp shuffle-down: 4 warps x 32 lanes
    mean, m2, n = _halve(mean, m2, n, 4, 16)
    mean, m2, n = _halve(mean, m2, n, 4, 8)
    mean, m2, n = _halve(mean, m2, n, 4, 4)
    mean, m2, n = _halve(mean, m2, n, 4, 2)
    mean, m2, n = _halve(mean, m2, n, 4, 1)
    # inter-warp through shared memory: (0 <- 2, 1 <- 3), then (0 <- 1)
    mean, m2, n = _halve(mean, m2, n, 1, 2)
    mean, m2, n = _halve(mean, m2, n, 1, 1)
    return mean, m2, n


@triton.jit
def rsqrt_approx(x, EXACT_RSQRT: tl.constexpr):
    """CUDA's ``rsqrtf`` (rsqrt.approx.f32). The interpreter has no PTX: it uses 1/sqrt."""
    if EXACT_RSQRT:
        return 1.0 / tl.sqrt(x)
    else:
        return tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def row_welford(row_ptr, n_vec, ITERS: tl.constexpr, COLUMNS: tl.constexpr = 0,
                DYNAMIC: tl.constexpr = 0, TREE: tl.constexpr = 0):
    """Mean and m2 of one row of ``4 * n_vec`` elements, in ATen's vectorized order.

    Thread ``t`` takes vectors ``t + 128 k``; its count before element ``4k + j`` is exactly
    ``4k + j``, so ``1 / count`` is known up front (fp32-rounded: equal to the correctly
    rounded division for every count below 2**17).
    """
    t = tl.arange(0, THREADS_C)
    lane = tl.arange(0, VEC_C)
    mean = tl.zeros((THREADS_C,), tl.float32)
    m2 = tl.zeros((THREADS_C,), tl.float32)
    n = tl.zeros((THREADS_C,), tl.float32)
    if DYNAMIC:
        for k in range(ITERS):
            v = t + k * THREADS_C
            active = v < n_vec
            p = row_ptr + v * VEC_C
            c = tl.zeros((THREADS_C,), tl.float32) + k * 4  # the count before this vector
            x0 = tl.load(p, mask=active, other=0.0).to(tl.float32)
            x1 = tl.load(p + 1, mask=active, other=0.0).to(tl.float32)
            x2 = tl.load(p + 2, mask=active, other=0.0).to(tl.float32)
            x3 = tl.load(p + 3, mask=active, other=0.0).to(tl.float32)
            mean, m2 = _online(mean, m2, x0, active, _rcp(c + 1.0))
            mean, m2 = _online(mean, m2, x1, active, _rcp(c + 2.0))
            mean, m2 = _online(mean, m2, x2, active, _rcp(c + 3.0))
            mean, m2 = _online(mean, m2, x3, active, _rcp(c + 4.0))
            n = tl.where(active, n + 4.0, n)
    else:
        for k in tl.static_range(ITERS):
            v = t + k * THREADS_C
            active = v < n_vec
            if COLUMNS:
                p = row_ptr + v * VEC_C
                x0 = tl.load(p, mask=active, other=0.0).to(tl.float32)
                x1 = tl.load(p + 1, mask=active, other=0.0).to(tl.float32)
                x2 = tl.load(p + 2, mask=active, other=0.0).to(tl.float32)
                x3 = tl.load(p + 3, mask=active, other=0.0).to(tl.float32)
            else:
                vec = tl.load(row_ptr + v[:, None] * VEC_C + lane[None, :], mask=active[:, None], other=0.0)
                x0, x1, x2, x3 = unpack4(vec.to(tl.float32))
            mean, m2 = _online(mean, m2, x0, active, 1.0 / (4 * k + 1))
            mean, m2 = _online(mean, m2, x1, active, 1.0 / (4 * k + 2))
            mean, m2 = _online(mean, m2, x2, active, 1.0 / (4 * k + 3))
            mean, m2 = _online(mean, m2, x3, active, 1.0 / (4 * k + 4))
            n = tl.where(active, n + 4.0, n)
    if TREE == 1:
        return tl.reduce((mean, m2, n), 0, welford_combine)
    elif TREE == 2:
        return tl.reduce((mean, m2, n), 0, _welford_combine_swapped)
    else:
        return block_welford_reduce(mean, m2, n)


@triton.jit
def _welford_combine_swapped(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    return welford_combine(mean_b, m2_b, n_b, mean_a, m2_a, n_a)


@triton.jit
def _rcp(c):
    return tl.math.div_rn(tl.full(c.shape, 1.0, tl.float32), c)


@triton.jit
def unpack4(vec):
    """The four columns of a [R, 4] tile, in order."""
    even, odd = tl.split(tl.reshape(vec, (vec.shape[0], 2, 2)))  # (0, 2) and (1, 3)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _online(mean, m2, x, active, inv_count):
    """cuWelfordOnlineSum for lanes that hold an element."""
    delta = x - mean
    new_mean = tl.fma(delta, inv_count, mean)
    new_m2 = tl.fma(delta, x - new_mean, m2)
    return tl.where(active, new_mean, mean), tl.where(active, new_m2, m2)
