"""sgdiff::layernorm_modulate of channels-first rows, normalized where they lie: no transposing copy.

``x = y.transpose(1, 2)`` of a ``[B, N, S]`` tensor is read as ``[B, S, N]``: each row (a
token) has its N channels S elements apart. Eager's LayerNorm makes such an x contiguous first
(a transposing copy), then normalizes the copy's rows with its vectorized kernel; the modulation
follows. The copy moves the values unchanged, so normalizing the rows where they lie gives the
same bits (verified at first sight, like every op), and saves the copy's write and its read.

A program takes ``R`` consecutive tokens of one batch entry. Each load of x is an ``[R, ...]``
tile whose R tokens are adjacent in memory (coalesced where ``stride(1) == 1``):

1. the statistics: ATen's 128 threads of a row (``l = 64 a + 32 b + 16 hi + lo``; thread l
   folds its vectors ``l + 128 k`` serially, :func:`~sgdiff.kernels.triton.welford.fold_vector`)
   are held in the order ``j = 64 hi + 4 lo + 2 a + b``, so that halving j's axis seven times
   (:func:`~sgdiff.kernels.triton.rows.halves`, first half the one that folds in the other)
   takes ATen's tree on lane 0's path: shuffle offset 16 (hi), 8, 4, 2, 1 (lo's bits), warps
   0 <- 2 and 1 <- 3 (a), then 0 <- 1 (b). Each combine is ``welford_combine`` with the counts
   it is given, empty states included, as ATen's;
2. the rows are read again (from L2), normalized and modulated with the 4-warp kernel's
   arithmetic (:func:`~sgdiff.kernels.triton.welford.aten_affine`,
   :func:`~sgdiff.kernels.triton.welford.modulate_rounded`) and stored contiguous, as eager's
   output is; Triton transposes each tile through shared memory between the load and the store.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.triton.cuda_math import INTERPRET, rsqrtf, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import TL_DTYPE, cached_plan, halves
from sgdiff.kernels.triton.welford import (
    THREADS,
    THREADS_C,
    VEC,
    VEC_C,
    aten_affine,
    fold_vector,
    modulate_rounded,
    unpack4,
    welford_combine,
)

TOKENS = 16  # R: a program's tokens (32 bytes of bf16 x a load, a sector)
CHUNK = tl.constexpr(512)  # the second pass's channels a step


@LeanKernel
@triton.jit
def _layernorm_modulate_cols_kernel(
    x_ptr,  # [B, S, N] read through (stride_xb, stride_xs, stride_xn)
    w_ptr, b_ptr, scale_ptr, shift_ptr,  # as _layernorm_modulate_kernel's
    out_ptr,  # [B, S, N] contiguous
    S,
    N: tl.constexpr,
    stride_xb, stride_xs, stride_xn,
    stride_scb, stride_scs, stride_scn,
    stride_shb, stride_shs, stride_shn,
    eps,
    ITERS: tl.constexpr,  # ceil(N / 4 / 128)
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    PLUS_ONE: tl.constexpr,
    DTYPE: tl.constexpr,
    INTERPRET: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    R: tl.constexpr,
):
    bi = tl.program_id(1).to(tl.int64)
    s = tl.program_id(0) * R + tl.arange(0, R)  # [R] tokens
    token_ok = s < S
    s = s.to(tl.int64)
    x_rows = x_ptr + bi * stride_xb + s * stride_xs
    # ATen's threads in tree order: j = 64 hi + 4 lo + 2 a + b holds thread l = 64 a + 32 b + 16 hi + lo
    j = tl.arange(0, THREADS_C)
    l = 64 * ((j // 2) % 2) + 32 * (j % 2) + 16 * (j // 64) + (j // 4) % 16
    lane = tl.arange(0, VEC_C)
    grid_dependency_wait()
    zero = tl.zeros((R, THREADS_C), tl.float32)
    mean, m2, n = zero, zero, zero
    for k in tl.static_range(ITERS):
        v = l + k * THREADS_C  # [128]: each thread's k-th vector
        active = v < N // VEC_C
        col = v[:, None] * VEC_C + lane[None, :]  # [128, 4]
        mask = token_ok[:, None, None] & active[None, :, None]
        tile = tl.load(x_rows[:, None, None] + col[None, :, :] * stride_xn, mask=mask, other=0.0)  # idle: zeros
        mean, m2, n = fold_vector(mean, m2, n, unpack4(to_fp32(tile)), active[None, :], k, ITERS)
    for level in tl.static_range(7):  # hi, lo's four bits, a, b: ATen's tree on lane 0's path
        mean_own, mean_oth = halves(mean)
        m2_own, m2_oth = halves(m2)
        n_own, n_oth = halves(n)
        mean, m2, n = welford_combine(mean_own, m2_own, n_own, mean_oth, m2_oth, n_oth)
    mean = tl.reshape(mean, (R, 1))
    var = tl.math.div_rn(m2, tl.full(m2.shape, N, tl.float32))
    rstd = tl.reshape(rsqrtf(var + eps, INTERPRET), (R, 1))

    out_rows = out_ptr + (bi * S + s) * N
    for c0 in tl.static_range(0, N, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        mask = token_ok[:, None] & (c < N)[None, :]
        x = to_fp32(tl.load(x_rows[:, None] + c[None, :] * stride_xn, mask=mask))
        w = to_fp32(tl.load(w_ptr + c, mask=c < N))[None, :] if HAS_WEIGHT else None
        b = to_fp32(tl.load(b_ptr + c, mask=c < N))[None, :] if HAS_BIAS else None
        centered = x - mean
        y = aten_affine(rstd * centered, rstd, centered, w, b)
        sc = tl.load(scale_ptr + bi * stride_scb + s[:, None] * stride_scs + c[None, :] * stride_scn,
                     mask=mask) if HAS_SCALE else None
        sh = tl.load(shift_ptr + bi * stride_shb + s[:, None] * stride_shs + c[None, :] * stride_shn,
                     mask=mask) if HAS_SHIFT else None
        y = modulate_rounded(y.to(DTYPE), sc, sh, PLUS_ONE, HAS_SCALE, HAS_SHIFT, DTYPE)
        tl.store(out_rows[:, None] + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def supported(x, scale_addend=None, shift_addend=None) -> bool:
    """Inputs this kernel takes, beyond what the 4-warp kernel's checks ask of the others: a 3-D
    x whose last dim is strided, the grid's batch axis within bounds, a batch entry's offsets
    within 32 bits (the channels' offsets are), no addends (otherwise the launch makes x
    contiguous first, :func:`sgdiff.kernels.triton.layernorm_modulate.bind`)."""
    return (x.dim() == 3 and x.stride(-1) != 1 and x.shape[0] < 2 ** 16
            and x.shape[2] * abs(x.stride(2)) < 2 ** 31 and scale_addend is None and shift_addend is None)


@cached_plan
def _plan(x, scale, shift):
    B, S, N = x.shape

    def strides(t):
        return t.expand(x.shape).stride() if t is not None else (0, 0, 0)

    return (triton.cdiv(S, TOKENS), B), (S, N, *x.stride(), *strides(scale), *strides(shift)), \
        triton.cdiv(N // VEC, THREADS)


def bind(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None):
    """The launch ``launch(x, weight, bias, scale, shift)`` for inputs of this signature."""
    grid, ints, iters = _plan(x, scale, shift)
    dtype = x_dtype or x.dtype
    out_dtype = out_dtype or dtype
    kernel = _layernorm_modulate_cols_kernel.bind(
        grid, ITERS=iters, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, HAS_SHIFT=shift is not None,
        PLUS_ONE=scale_plus_one, DTYPE=TL_DTYPE[dtype], INTERPRET=INTERPRET, HAS_SCALE=scale is not None,
        R=TOKENS, num_warps=4, enable_fp_fusion=False)
    shape = x.shape

    def launch(x, weight, bias, scale, shift):
        out = torch.empty(shape, dtype=out_dtype, device=x.device)
        scale_arg = scale if scale is not None else x
        kernel(x, weight if weight is not None else x, bias if bias is not None else x, scale_arg,
               shift if shift is not None else scale_arg, out, *ints, eps)
        return out

    return launch
