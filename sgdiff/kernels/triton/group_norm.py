"""Triton sgdiff::group_norm: ATen's GroupNorm, its statistics spread over every SM.

PyTorch's ``GroupNormKernelImplInternal`` (aten/src/ATen/native/cuda/group_norm_kernel.cu) runs
``RowwiseMomentsCUDAKernel`` with one block per (sample, group): at a VAE decoder's 32 groups,
32 blocks, so 32 of an H200's 132 SMs hold the whole statistics pass (44.6 of a Flux VAE
decode's 86 ms). Its order, which these kernels keep:

1. the group's ``L = D * HxW`` elements (contiguous) are read by ``T`` threads (512, or 32
   where ``L < 512``), thread ``t`` folding elements ``t, t + T, t + 2T, ...`` in turn into a
   serial Welford state (``WelfordOps::reduce``, as nvcc compiles it)::

       n += 1;  delta = x - mean;  mean = mean + delta / n      # IEEE division
       m2 = fma(delta, x - mean, m2)

2. each warp folds its 32 states with shuffle-down (offsets 16, 8, 4, 2, 1), lane ``i``
   combining its state with lane ``i + offset``'s (``WelfordOps::combine(own, other)``: an
   empty side returns the other; else ``r = other.n / (own.n + other.n)``,
   ``mean = fma(other.mean - own.mean, r, own.mean)``,
   ``m2 = fma(delta * delta * own.n, r, own.m2 + other.m2)``);
3. with 512 threads, warp 0 folds the 16 warps' states the same way (lanes 16-31 empty);
4. ``rstd = rsqrtf(m2 / n + eps)``, ``eps`` first rounded to ``x``'s dtype (the kernel takes it
   as ``T``); ``mean`` and ``rstd`` stored in ``x``'s dtype, and up to torch 2.11 read back from
   there (rounded: :func:`stats_rounded`); then per channel ``a = rstd * gamma`` and
   ``b = (-a * mean) + beta``, two roundings (``ComputeFusedParamsCUDAKernel``: measured on the
   H200, nvcc does not contract it), and ``y = fma(a, x, b)`` rounded to ``x``'s dtype.

Here step 1 runs on ``N * G * SPLIT`` programs, each holding ``T / SPLIT`` of ATen's threads
(each thread's serial fold is unchanged, only spread over more SMs), and folds its warps'
states as step 2 does; a second kernel folds the warps' states of a group (step 3) and writes
``a`` and ``b``; a third applies them, and the SiLU after the norm (ATen's, of the rounded
output) where the op has one. The trees are written as halvings of explicit tensors
(:func:`sgdiff.kernels.triton.rows.halves`), so their order does not depend on Triton's layout.

The serial fold is what the statistics wait on (a group's thread folds ``L / T`` elements one
after another: 16384 at a 1024² map of 256 channels), so its step is kept short. Where every
lane of a batch is active, a thread's count before each element is known, and ``delta / n``
is taken as ``div.rn``'s own fast path computes it: ``q0 = delta * r`` with ``r = 1 / n``
correctly rounded (:func:`~sgdiff.kernels.triton.cuda_math.count_reciprocal`, off the serial
path), ``q = fma(fma(-q0, n, delta), r, q0)`` (Markstein's theorem: the correctly rounded
quotient wherever nothing underflows or overflows), without ``div.rn``'s range check and
slow-path branch. A thread flags any ``delta`` outside ``[2**-90, 2**126]`` (other than 0:
inf, NaN, or a quotient that could fall below the normal range); a program with a flag
folds its elements again with ``div.rn``.

``pre_bias`` (sgdiff::conv_group_norm): ``x`` is a bias-free convolution's output and ATen's
``x.add_(bias)`` (an fp32 sum rounded to ``x``'s dtype) is taken as each element is read, by
the statistics and by the apply, so the biased map is never written. Where the convolution read
a channels-last input its output is channels-last too, and the statistics need ATen's
contiguous order: the bias's pass (:mod:`sgdiff.kernels.triton.strided_epilogue`) then writes
the biased map contiguous, in place of the transpose cuDNN runs after an NCHW convolution.
``channels_last``: the apply writes its output channels-last (tiles of channels by positions),
for the convolution that reads it (:mod:`sgdiff.fxpasses.layouts`).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sgdiff.kernels.conv_group_norm import conv_group_norm_reference
from sgdiff.kernels.layout import channels_last_format, channels_last_strides, contiguous_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import strided_epilogue
from sgdiff.kernels.triton.conv_bias import conv_epilogue_bind, conv_output_shape, on_cudnn
from sgdiff.kernels.triton.cuda_math import INTERPRET_C, count_reciprocal, rsqrtf, silu_rounded
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan, halves

BLOCK_THREADS = 512  # ATen's block where a group has at least that many elements
WARP = 32
APPLY_BLOCK = 2048
CL_BLOCK_C, CL_TILE = 64, 4096  # the channels-last apply's tile: channels, elements


@triton.jit
def _welford_step(mean, m2, n, x, active):
    """WelfordOps::reduce of ``x`` into each active lane's state."""
    n1 = n + 1.0
    delta = x - mean
    new_mean = mean + tl.math.div_rn(delta, n1)
    new_m2 = tl.fma(delta, x - new_mean, m2)
    return tl.where(active, new_mean, mean), tl.where(active, new_m2, m2), tl.where(active, n1, n)


@triton.jit
def _combine(a_mean, a_m2, a_n, b_mean, b_m2, b_n):
    """WelfordOps::combine(a, b), as nvcc compiles it: an empty ``a`` gives ``b``, an empty ``b``
    gives ``a``."""
    delta = b_mean - a_mean
    count = a_n + b_n
    ratio = tl.math.div_rn(b_n, tl.where(count == 0.0, 1.0, count))
    mean = tl.fma(delta, ratio, a_mean)
    m2 = tl.fma(delta * delta * a_n, ratio, a_m2 + b_m2)
    empty_b = b_n == 0.0
    mean, m2, count = tl.where(empty_b, a_mean, mean), tl.where(empty_b, a_m2, m2), tl.where(empty_b, a_n, count)
    empty_a = a_n == 0.0
    return tl.where(empty_a, b_mean, mean), tl.where(empty_a, b_m2, m2), tl.where(empty_a, b_n, count)


@triton.jit
def _fold(mean, m2, n, LEVELS: tl.constexpr):
    """Fold each row of [R, 2**LEVELS] states as a shuffle-down tree does (lane i with lane
    i + W/2, then i + W/4, ...): the states of lane 0, [R, 1]."""
    for _ in tl.static_range(LEVELS):
        m0, m1 = halves(mean)
        q0, q1 = halves(m2)
        n0, n1 = halves(n)
        mean, m2, n = _combine(m0, q0, n0, m1, q1, n1)
    return mean, m2, n


@triton.jit
def _fold_columns(mean, m2, n, x, active, W: tl.constexpr):
    """[R, W] elements folded into each row's state, column 0 first (lane t's batch: its
    elements t, t + T, ..., t + (W - 1)T, in that order)."""
    if W == 1:
        return _welford_step(mean, m2, n, tl.reshape(x, [x.shape[0]]), tl.reshape(active, [x.shape[0]]))
    else:
        x_lo, x_hi = halves(x)
        a_lo, a_hi = halves(active)
        mean, m2, n = _fold_columns(mean, m2, n, x_lo, a_lo, W // 2)
        return _fold_columns(mean, m2, n, x_hi, a_hi, W // 2)


TINY = tl.constexpr(2.0 ** -90)  # |delta| below this (but 0), or above HUGE: div.rn's own path
HUGE = tl.constexpr(2.0 ** 126)


@triton.jit
def div_count(delta, n, r):
    """``delta / n`` for a count ``n`` given ``r = 1 / n`` correctly rounded: div.rn's fast path
    (see the module's docstring; exact where :func:`_welford_step_known` does not flag)."""
    q0 = delta * r
    return tl.fma(tl.fma(q0 * -1.0, n, delta), r, q0)


@triton.jit
def _welford_step_known(mean, m2, unsafe, x, n1, r):
    """:func:`_welford_step` of an active lane whose count becomes ``n1``, ``r`` = 1 / n1
    correctly rounded: the division as div.rn's fast path takes it (see the module's
    docstring), ``unsafe`` flagging a ``delta`` outside the range where that is exact."""
    delta = x - mean
    new_mean = mean + div_count(delta, n1, r)
    a = tl.abs(delta)
    unsafe = unsafe | ((a < TINY) & (a != 0.0)) | (a > HUGE) | (a != a)
    return new_mean, tl.fma(delta, x - new_mean, m2), unsafe


@triton.jit
def _fold_columns_known(mean, m2, unsafe, x, count, W: tl.constexpr):
    """:func:`_fold_columns` of [R, W] elements all active, each lane having folded ``count``
    (fp32, [R]) before column 0."""
    if W == 1:
        n1 = count + 1.0
        return _welford_step_known(mean, m2, unsafe, tl.reshape(x, [x.shape[0]]), n1, count_reciprocal(n1))
    else:
        x_lo, x_hi = halves(x)
        mean, m2, unsafe = _fold_columns_known(mean, m2, unsafe, x_lo, count, W // 2)
        return _fold_columns_known(mean, m2, unsafe, x_hi, count + W // 2, W // 2)


@triton.jit
def _values(x, idx, pb, HW, PRE_BIAS: tl.constexpr):
    """Elements ``x`` (index ``idx`` in their group) in fp32, the convolution's bias of their
    channel (``pb``: the group's first) added and rounded to x's dtype first where PRE_BIAS."""
    v = x.to(tl.float32)
    if PRE_BIAS:
        v = (v + tl.load(pb + idx // HW).to(tl.float32)).to(x.dtype).to(tl.float32)
    return v


@triton.jit
def _values_span(x, idx, lo, pb, HW, L, PRE_BIAS: tl.constexpr):
    """:func:`_values` for a batch whose indices (from ``lo`` up) cross at most one channel
    boundary (HW at least the batch's span): two bias loads, no division an element."""
    v = x.to(tl.float32)
    if PRE_BIAS:
        c0 = lo // HW
        bound = (c0 + 1) * HW
        b0 = tl.load(pb + c0).to(tl.float32)
        b1 = tl.load(pb + c0 + 1, mask=bound < L, other=0.0).to(tl.float32)
        v = (v + tl.where(idx >= bound, b1, b0)).to(x.dtype).to(tl.float32)
    return v


@triton.jit
def _fold_from(mean, m2, n, base, pb, lane, first, L, HW, THREADS: tl.constexpr, PRE_BIAS: tl.constexpr):
    """Each lane's state folded on over its elements from ``first`` (a multiple of THREADS) to the
    group's end with div.rn at every step, 16 a load, lanes past the end idle: a group's last,
    partial batch, or the whole group again where the fast division was flagged."""
    step = lane[:, None] + tl.arange(0, 16)[None, :] * THREADS
    for start in range(first, L, 16 * THREADS):
        idx = start + step
        x = tl.load(base + idx, mask=idx < L, other=0.0)
        mean, m2, n = _fold_columns(mean, m2, n, _values(x, idx, pb, HW, PRE_BIAS), idx < L, 16)
    return mean, m2, n


@LeanKernel
@triton.jit
def _moments_kernel(
    x_ptr, pb_ptr, part_ptr,  # pb: the convolution's bias [C] (PRE_BIAS); part: [N * G, WARPS_PER_GROUP, 3]
    L,  # elements in a group                                  fp32 (mean, m2, n) per ATen warp
    HW, G,  # elements a channel, groups
    THREADS: tl.constexpr,  # ATen's threads a group: 512 or 32
    LANES: tl.constexpr,  # of them, this program's
    WIDE: tl.constexpr,
    PRE_BIAS: tl.constexpr,
    SPAN: tl.constexpr,  # HW >= BATCH * THREADS: a batch crosses at most one channel boundary
    BATCH: tl.constexpr,  # a thread's elements a load (MOMENTS_BATCH)
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    if WIDE:
        row = row.to(tl.int64)
    lane = part * LANES + tl.arange(0, LANES)
    base = x_ptr + row * L
    pb = pb_ptr + (row % G) * (L // HW)
    mean = tl.zeros([LANES], tl.float32)
    m2 = tl.zeros([LANES], tl.float32)
    count = tl.zeros([LANES], tl.float32)
    unsafe = tl.zeros([LANES], tl.int1)
    grid_dependency_wait()
    # BATCH of a thread's elements a load, loaded two batches ahead of the serial fold (ATen's
    # loop keeps 16 warps an SM waiting on memory; these programs hold fewer)
    step = lane[:, None] + tl.arange(0, BATCH)[None, :] * THREADS
    batch = BATCH * THREADS
    whole = L // batch * batch  # elements in batches where every lane is active
    xa = tl.load(base + step, mask=step < L, other=0.0)
    xb = tl.load(base + batch + step, mask=batch + step < L, other=0.0)
    for start in range(0, whole, batch):
        ahead = start + 2 * batch + step
        xc = tl.load(base + ahead, mask=ahead < L, other=0.0)
        if SPAN:
            v = _values_span(xa, start + step, start + part * LANES, pb, HW, L, PRE_BIAS)
        else:
            v = _values(xa, start + step, pb, HW, PRE_BIAS)
        mean, m2, unsafe = _fold_columns_known(mean, m2, unsafe, v, count, BATCH)
        count += BATCH
        xa, xb = xb, xc
    mean, m2, n = _fold_from(mean, m2, count, base, pb, lane, whole, L, HW, THREADS, PRE_BIAS)
    if tl.max(unsafe.to(tl.int32), 0) > 0:
        zero = tl.zeros([LANES], tl.float32)
        mean, m2, n = _fold_from(zero, zero, zero, base, pb, lane, 0, L, HW, THREADS, PRE_BIAS)
    mean, m2, n = _fold(tl.reshape(mean, [LANES // 32, 32]), tl.reshape(m2, [LANES // 32, 32]),
                        tl.reshape(n, [LANES // 32, 32]), 5)
    warp = part * (LANES // 32) + tl.arange(0, LANES // 32)
    out = part_ptr + (row * (THREADS // 32) + warp) * 3
    tl.store(out, tl.reshape(mean, [LANES // 32]))
    tl.store(out + 1, tl.reshape(m2, [LANES // 32]))
    tl.store(out + 2, tl.reshape(n, [LANES // 32]))


@LeanKernel
@triton.jit
def _fused_params_kernel(
    part_ptr, w_ptr, b_ptr, a_ptr, bias_ptr,  # a, bias: [N * C] fp32 (ComputeFusedParams' a and b)
    eps,  # fp32: eps rounded to x's dtype
    G, D,  # groups, channels a group
    WARPS: tl.constexpr,  # ATen's warps a group: 16, or 1
    WARP_LEVELS: tl.constexpr,  # log2(WARPS)
    BLOCK_D: tl.constexpr,
    ROUND_STATS: tl.constexpr,  # mean and rstd rounded to x's dtype (the weight's) before use
):
    row = tl.program_id(0)  # n * G + g
    grid_dependency_wait()
    if WARPS == 1:
        mean = tl.load(part_ptr + row * 3)
        m2 = tl.load(part_ptr + row * 3 + 1)
        n = tl.load(part_ptr + row * 3 + 2)
    else:  # warp 0 folds the warps' states (lanes past them empty: folding those changes nothing)
        w = tl.arange(0, WARPS)
        p = part_ptr + (row * WARPS + w) * 3
        mean, m2, n = _fold(tl.reshape(tl.load(p), [1, WARPS]), tl.reshape(tl.load(p + 1), [1, WARPS]),
                            tl.reshape(tl.load(p + 2), [1, WARPS]), WARP_LEVELS)
        mean, m2, n = tl.sum(mean, 1), tl.sum(m2, 1), tl.sum(n, 1)  # [1] -> scalar: one element each
        mean, m2, n = tl.sum(mean, 0), tl.sum(m2, 0), tl.sum(n, 0)
    rstd = rsqrtf(tl.math.div_rn(m2, n) + eps, INTERPRET=INTERPRET_C)
    if ROUND_STATS:
        mean = mean.to(w_ptr.dtype.element_ty).to(tl.float32)
        rstd = rstd.to(w_ptr.dtype.element_ty).to(tl.float32)
    c = tl.arange(0, BLOCK_D)
    inside = c < D
    channel = (row // G) * (G * D) + (row % G) * D + c  # n * C + g * D + c
    gamma = tl.load(w_ptr + (row % G) * D + c, mask=inside, other=1.0).to(tl.float32)
    beta = tl.load(b_ptr + (row % G) * D + c, mask=inside, other=0.0).to(tl.float32)
    a = rstd * gamma
    tl.store(a_ptr + channel, a, mask=inside)
    tl.store(bias_ptr + channel, (a * -1.0) * mean + beta, mask=inside)  # no fp fusion: two roundings


@LeanKernel
@triton.jit
def _apply_kernel(
    x_ptr, pb_ptr, a_ptr, bias_ptr, out_ptr,
    HW, C,
    SILU: tl.constexpr,
    PRE_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
):
    nc = tl.program_id(0)  # n * C + c: one channel's HW elements, BLOCK of them a program
    start = tl.program_id(1) * BLOCK
    if WIDE:
        row = nc.to(tl.int64) * HW
    else:
        row = nc * HW
    j = start + tl.arange(0, BLOCK)
    inside = j < HW
    grid_dependency_wait()
    x = tl.load(x_ptr + row + j, mask=inside, other=0.0)
    v = x.to(tl.float32)
    if PRE_BIAS:
        v = (v + tl.load(pb_ptr + nc % C).to(tl.float32)).to(x.dtype).to(tl.float32)
    y = tl.fma(tl.load(a_ptr + nc), v, tl.load(bias_ptr + nc)).to(out_ptr.dtype.element_ty)
    if SILU:
        y = silu_rounded(y.to(tl.float32), out_ptr.dtype.element_ty, INTERPRET_C)
    tl.store(out_ptr + row + j, y, mask=inside)


@LeanKernel
@triton.jit
def _apply_channels_last_kernel(
    x_ptr, pb_ptr, a_ptr, bias_ptr, out_ptr,
    HW, C,
    SILU: tl.constexpr,
    PRE_BIAS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WIDE: tl.constexpr,
):
    """The apply of a contiguous ``x`` written channels-last: a tile of BLOCK_C channels by
    BLOCK_S positions read along positions and written along channels."""
    n, c, s, inside = strided_epilogue.channel_tile(C, HW, BLOCK_C, BLOCK_S, WIDE)
    grid_dependency_wait()
    x = tl.load(x_ptr + (n * C + c) * HW + s, mask=inside, other=0.0)
    v = x.to(tl.float32)
    if PRE_BIAS:
        v = (v + tl.load(pb_ptr + c, mask=c < C, other=0.0).to(tl.float32)).to(x.dtype).to(tl.float32)
    a = tl.load(a_ptr + n * C + c, mask=c < C, other=0.0)
    y = tl.fma(a, v, tl.load(bias_ptr + n * C + c, mask=c < C, other=0.0)).to(out_ptr.dtype.element_ty)
    if SILU:
        y = silu_rounded(y.to(tl.float32), out_ptr.dtype.element_ty, INTERPRET_C)
    tl.store(out_ptr + (n * HW + s) * C + c, y, mask=inside)


def supported_layout(x, weight, bias, groups, eps, silu=False, channels_last=False) -> bool:
    """can_use without the device check: a contiguous [N, C, *spatial] float tensor with a
    spatial extent (ATen's 1-d path, HxW = 1, writes another formula), C a multiple of the
    groups, the affine's weight and bias both given in x's dtype (ATen writes other formulas
    without them)."""
    return x.dim() >= 3 and x.is_contiguous() and _fits(tuple(x.shape), x.dtype, weight, bias, groups, channels_last)


def _fits(shape, dtype, weight, bias, groups, channels_last=False) -> bool:
    """supported_layout's conditions on a contiguous input of this shape and dtype (and an
    output written channels-last where asked: a 4-d or 5-d one)."""
    if channels_last and (channels_last_format(len(shape)) is None or shape[0] >= 2 ** 16
                          or triton.cdiv(shape[1], CL_BLOCK_C) >= 2 ** 16):
        return False
    n, c, numel = shape[0], shape[1], math.prod(shape)
    if not (dtype in DTYPES and numel > 0 and isinstance(groups, int) and groups > 0 and c % groups == 0):
        return False
    hw = numel // (n * c)
    return (hw > 1 and weight is not None and bias is not None and weight.dtype == bias.dtype == dtype
            and weight.shape == bias.shape == (c,) and weight.is_contiguous() and bias.is_contiguous()
            and numel // n // groups < 2 ** 24  # a thread's count held exactly in fp32
            and triton.cdiv(hw, APPLY_BLOCK) < 2 ** 16)  # the apply's grid


def can_use(x, weight, bias, groups, eps, silu=False, channels_last=False) -> bool:
    return x.is_cuda and supported_layout(x, weight, bias, groups, eps, silu, channels_last)


def conv_supported_layout(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, weight, bias, groups,
                          eps, silu=False, channels_last=False, conv_as_contiguous=False) -> bool:
    """sgdiff::conv_group_norm's inputs but the device and the backend: a biased 2-D or 3-D
    convolution of a contiguous weight and a contiguous ``x`` (its output then contiguous) or a
    channels-last one (``conv_as_contiguous``: the output, channels-last, is made contiguous by
    the bias's pass) whose output the norm takes."""
    shape = conv_output_shape(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, conv_as_contiguous)
    return (shape is not None and _fits(shape, x.dtype, weight, bias, groups, channels_last)
            and (x.is_contiguous() or strided_epilogue.fits(shape, channels_last_strides(shape))))


def conv_can_use(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, *norm) -> bool:
    return (x.is_cuda and conv_supported_layout(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups,
                                                *norm)
            and on_cudnn(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups))


SM_COUNT = 132  # programs enough for every SM of an H200 twice over (fewer SMs: more waves)


@cached_plan
def _plan(x, groups):
    n, c = x.shape[0], x.shape[1]
    length = x.numel() // (n * groups)
    threads = BLOCK_THREADS if length >= BLOCK_THREADS else WARP
    rows = n * groups
    split = 1
    while threads // split > WARP and rows * split < 2 * SM_COUNT:
        split *= 2
    return dict(length=length, threads=threads, lanes=threads // split, split=split, rows=rows,
                d=c // groups, hw=x.numel() // (n * c), wide=x.numel() >= 2 ** 31)


_ROUNDED_BY_DEVICE: dict = {}
# the guess where no probe runs: torch 2.11's ComputeFusedParamsCUDAKernel reads them as T
_ROUNDED_GUESS = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 12)


def stats_rounded(device: torch.device) -> bool:
    """Whether this build's CUDA GroupNorm rounds ``mean`` and ``rstd`` to the input's dtype
    before its fused parameters read them (torch 2.11 does: ``ComputeFusedParamsCUDAKernel`` takes
    them as ``T``; later builds keep them in fp32). Found once per device by running both on a
    probe against ATen; from the torch version where no probe can run (CPU, a capture) or
    neither matches (first-sight verification then decides the op)."""
    guess = _ROUNDED_GUESS
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return guess
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _ROUNDED_BY_DEVICE:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = (torch.randn(1, 64, 16, 16, generator=g) * 3 + 0.5).to(device, torch.bfloat16)
        w, b = (torch.randn(64, generator=g) + 1).to(x), torch.randn(64, generator=g).to(x)
        want = torch.ops.aten.native_group_norm.default(x, w, b, 1, 64, 256, 8, 1e-6)[0]
        found = [r for r in (guess, not guess) if torch.equal(bind(x, w, b, 8, 1e-6, round_stats=r)(x, w, b), want)]
        _ROUNDED_BY_DEVICE[key] = found[0] if found else guess
    return _ROUNDED_BY_DEVICE[key]


# A thread's elements a load, two loads ahead of its fold: the statistics wait on memory until
# enough is in flight (at a Flux VAE map of 128 x 1024², GroupNorm + SiLU took 491 µs with 16,
# 417 with 32, 378 with 64 on the H200; bench/results/runs/group-norm-batch-2026-12-04.md).
MOMENTS_BATCH = 64


def _launcher(x, weight, bias, groups, eps, silu, round_stats, pre_bias, channels_last=False):
    """``launch(x, weight, bias, pb)`` for inputs of this signature, its host arithmetic done."""
    groups = int(groups)
    if round_stats is None:
        round_stats = stats_rounded(x.device)
    p = _plan(x, groups)
    warps = p["threads"] // WARP
    moments = _moments_kernel.bind((p["rows"], p["split"]), THREADS=p["threads"], LANES=p["lanes"], WIDE=p["wide"],
                                   PRE_BIAS=pre_bias, SPAN=p["hw"] >= MOMENTS_BATCH * p["threads"],
                                   BATCH=MOMENTS_BATCH, num_warps=max(1, p["lanes"] // WARP), enable_fp_fusion=False)
    params = _fused_params_kernel.bind((p["rows"],), WARPS=warps, WARP_LEVELS=warps.bit_length() - 1,
                                       BLOCK_D=triton.next_power_of_2(p["d"]), ROUND_STATS=bool(round_stats),
                                       num_warps=1, enable_fp_fusion=False)
    channels = x.shape[0] * x.shape[1]
    if channels_last:
        block_s = max(16, min(CL_TILE // CL_BLOCK_C, triton.next_power_of_2(p["hw"])))
        apply = _apply_channels_last_kernel.bind(
            (triton.cdiv(p["hw"], block_s), triton.cdiv(x.shape[1], CL_BLOCK_C), x.shape[0]), SILU=bool(silu),
            PRE_BIAS=pre_bias, BLOCK_C=CL_BLOCK_C, BLOCK_S=block_s, WIDE=p["wide"], num_warps=4,
            enable_fp_fusion=False)
    else:
        block = min(APPLY_BLOCK, triton.next_power_of_2(p["hw"]))
        apply = _apply_kernel.bind((channels, triton.cdiv(p["hw"], block)), SILU=bool(silu), PRE_BIAS=pre_bias,
                                   BLOCK=block, WIDE=p["wide"], num_warps=max(1, min(8, block // 256)),
                                   enable_fp_fusion=False)
    out_strides = channels_last_strides(x.shape) if channels_last else tuple(x.stride())
    eps_t = float(torch.tensor(eps, dtype=x.dtype).float())  # ATen passes eps as the input's dtype
    shape, dtype, rows, length, hw, d, c = x.shape, x.dtype, p["rows"], p["length"], p["hw"], p["d"], x.shape[1]

    def launch(x, weight, bias, pb):
        part = torch.empty((rows, warps, 3), dtype=torch.float32, device=x.device)
        a = torch.empty(channels, dtype=torch.float32, device=x.device)
        b = torch.empty(channels, dtype=torch.float32, device=x.device)
        out = torch.empty_strided(shape, out_strides, dtype=dtype, device=x.device)
        moments(x, pb, part, length, hw, groups)
        params(part, weight, bias, a, b, eps_t, groups, d)
        apply(x, pb, a, b, out, hw, c)
        return out

    return launch


def bind(x, weight, bias, groups, eps, silu=False, channels_last=False, round_stats=None):
    """:func:`group_norm` for inputs of this signature, its host arithmetic done."""
    launch = _launcher(x, weight, bias, groups, eps, silu, round_stats, pre_bias=False, channels_last=channels_last)
    return lambda x, weight, bias, *_: launch(x, weight, bias, x)


def group_norm(x, weight, bias, groups, eps, silu=False, channels_last=False):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, bias, groups, eps, silu, channels_last)(x, weight, bias)


def _bind_pre_biased(y, conv_bias, weight, bias, groups, eps, silu=False, channels_last=False,
                     conv_as_contiguous=False):
    """The norm of a bias-free convolution's output ``y``, its bias added on read; or, where
    ``y`` is channels-last, added by the pass that makes it contiguous for the statistics (which
    read a group's elements in ATen's contiguous order)."""
    if y.is_contiguous():
        launch = _launcher(y, weight, bias, groups, eps, silu, None, pre_bias=True, channels_last=channels_last)
        return lambda y, conv_bias, weight, bias, *_: launch(y, weight, bias, conv_bias)
    biased = strided_epilogue.bind(y, None, None, contiguous_strides(y.shape))
    geometry = torch.empty(y.shape, dtype=y.dtype, device="meta")  # the launcher reads no values
    launch = _launcher(geometry, weight, bias, groups, eps, silu, stats_rounded(y.device), pre_bias=False,
                       channels_last=channels_last)

    def norm(y, conv_bias, weight, bias, *_):
        x = biased(y, conv_bias)
        return launch(x, weight, bias, x)

    return norm


def conv_group_norm_bind(*args):
    """:func:`conv_group_norm` for inputs of this signature."""
    return conv_epilogue_bind(conv_group_norm_reference, _bind_pre_biased)


def conv_group_norm(*args):
    """Launch; the caller has checked :func:`conv_can_use`."""
    return conv_group_norm_bind(*args)(*args)


GROUP_NORM = Impl(run=group_norm, supports=supported_layout, bind=bind)
# (whether ATen would run the convolution on cuDNN needs the device: supports checks it)
CONV_GROUP_NORM = Impl(run=conv_group_norm, supports=conv_can_use, bind=conv_group_norm_bind)
