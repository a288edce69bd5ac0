"""Triton sgdiff::linear_attention_apply, bitwise equal to eager on CUDA.

One program computes ``BLOCK_N`` tokens of one head's ``h = scores @ relu(q)`` and their
normalizer, each element one fp32 accumulator taking head_dim fused multiply-adds in increasing
k from +0 (cuBLAS's order for these fp32 shapes: no split-K), then divides by the normalizer
plus eps (``div_rn``, as ATen's division) and writes the result cast, where eager's cast writes
it: [B, tokens, heads * head_dim] with strides (heads * head_dim * tokens, 1, tokens). q's tile
is read once through its strides ([tokens, head_dim]: the query projection's transposed view, a
token's head_dim channels adjacent, so a token is one load), ReLU'd as ATen's and widened in
registers; step k takes its column out of the tile by a sum of it and -0.0s (exact: ``x + -0.0``
is ``x`` for every x, so the sum's order does not matter, and the compiler folds the additions
whose operand is a known -0.0), then one FMA per output element (``tl.fma``: fp32 rounding once,
whatever fp-fusion setting) with the scores' column k, read from the head's [D + 1, D] scores
(4 KiB at head_dim 32, cached). The normalizer row is its own [BLOCK_N] chain, so no output row
is spent on it. Each output is one chain of head_dim FMAs: no padding of the rows to a tensor
core's tile, no shared-memory staging of dot operands. h never reaches memory.

With Gluon, a second kernel (:func:`variants`: first sight times each tiling against the kernel
above and the former graph's ops) gives each thread ``T`` whole tokens' rows of q and ``J`` of
their outputs (``head_dim / J`` lanes share a token), with the normalizers, in its registers, so
that step k's column of q is a register of the thread (no sum across lanes) and the scores'
column k, the same for every token, reaches the lanes as vector loads from a transposed copy of
the head's scores in shared memory (a thread its J of them). The same chains, FMA for FMA, then
the same division and cast.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cast_copy import relu_as_aten
from sgdiff.kernels.triton.launch import LeanKernel, fresh_output, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan
from sgdiff.kernels.triton.in_thread import NEGATIVE_ZERO_BITS, bits, gluon, relu_as_aten as gl_relu_as_aten, take

if gluon is not None:
    from triton.experimental.gluon import language as gl

MAX_HEAD_DIM = 128  # a [BLOCK_N, head_dim] accumulator and q's tile in registers
MIN_BLOCK = 16
TILE = 4096  # elements of q's tile (and of the accumulator) a program: 32 a thread at 4 warps


@LeanKernel
@triton.jit
def _linear_attention_apply_kernel(
    scores_ptr,  # [B * heads, D + 1, D] fp32
    q_ptr,  # [B, heads, D, N]
    out_ptr,  # [B, N, heads * D] with strides (heads * D * N, 1, N)
    n_heads, N,
    ss0, ss1, ss2,
    sq0, sq1, sq2, sq3,
    eps,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D rounded up to a power of 2
    BLOCK_N: tl.constexpr,  # tokens a program
):
    pid = tl.program_id(0)  # (batch, head), split in 32 bits
    bh = pid.to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    n_ok, d_ok = n < N, d < D
    q_tile = q_ptr + (pid // n_heads).to(tl.int64) * sq0 + (pid % n_heads).to(tl.int64) * sq1
    s_head = scores_ptr + bh * ss0
    grid_dependency_wait()
    q = tl.load(q_tile + n[:, None] * sq3 + d[None, :] * sq2, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    q = relu_as_aten(q.to(tl.float32))
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # h transposed: a token's D outputs side by side
    den = tl.zeros([BLOCK_N], tl.float32)
    negative_zero = tl.full(q.shape, NEGATIVE_ZERO_BITS, tl.int32).to(tl.float32, bitcast=True)  # `-0.0` is +0.0
    for k in tl.static_range(D):  # k in increasing order
        qk = tl.sum(tl.where(d[None, :] == k, q, negative_zero), axis=1)  # q[:, k], exactly
        s = tl.load(s_head + d * ss1 + k * ss2, mask=d_ok, other=0.0)  # scores[:D, k]
        acc = tl.fma(qk[:, None], s[None, :], acc)
        den = tl.fma(qk, tl.load(s_head + D * ss1 + k * ss2), den)
    y = tl.math.div_rn(acc, (den + eps)[:, None])
    out = out_ptr + bh * D * N + d[None, :] * N + n[:, None]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])


if gluon is not None:
    @LeanKernel
    @gluon.jit
    def _linear_attention_apply_rows_kernel(
        scores_ptr, q_ptr, out_ptr,  # as _linear_attention_apply_kernel's
        n_heads, N,
        ss0, ss1, ss2,
        sq0, sq1, sq2, sq3,
        eps,
        D: gl.constexpr,
        BLOCK_D: gl.constexpr,  # D rounded up to a power of 2
        T: gl.constexpr,  # tokens a thread
        J: gl.constexpr,  # outputs of a token a thread (BLOCK_D: all)
        QL: gl.constexpr,  # [BLOCK_N, BLOCK_D]: a thread its tokens' rows of q, whole (rows_layouts)
    ):
        W: gl.constexpr = gl.num_warps()
        LJ: gl.constexpr = BLOCK_D // J  # lanes along a token's outputs
        BLOCK_N: gl.constexpr = T * (32 // LJ) * W
        ACC: gl.constexpr = gl.BlockedLayout([T, J], [32 // LJ, LJ], [W, 1], [0, 1])  # tokens fastest
        TOK: gl.constexpr = gl.SliceLayout(1, ACC)
        ALL: gl.constexpr = gl.SliceLayout(0, QL)  # every thread all of a row
        ST: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [W, 1], [1, 0])  # the scores' copy, [k, j]
        pid = gl.program_id(0)  # (batch, head)
        bh = pid.to(gl.int64)
        n0 = gl.program_id(1) * BLOCK_N
        n_q = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, QL))
        d = gl.arange(0, BLOCK_D, layout=ALL)
        q_tile = q_ptr + (pid // n_heads).to(gl.int64) * sq0 + (pid % n_heads).to(gl.int64) * sq1
        s_head = scores_ptr + bh * ss0
        kk = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(1, ST))
        jj = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ST))
        grid_dependency_wait()
        q = gl.load(q_tile + n_q[:, None] * sq3 + d[None, :] * sq2, mask=(n_q < N)[:, None] & (d < D)[None, :],
                    other=0.0)
        q = gl_relu_as_aten(q.to(gl.float32))
        s_den = gl.load(s_head + D * ss1 + d * ss2, mask=d < D, other=0.0)  # the normalizer's weights, in registers
        s_t = gl.load(s_head + jj[None, :] * ss1 + kk[:, None] * ss2, mask=(jj < D)[None, :] & (kk < D)[:, None],
                      other=0.0)  # scores[j, k] at [k, j]
        s_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_D, BLOCK_D], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]),
                                           s_t)
        acc = gl.zeros([BLOCK_N, BLOCK_D], gl.float32, ACC)  # a thread T tokens' J outputs
        den = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, QL))
        for k in gl.static_range(D):  # k in increasing order
            qk = take(q, d[None, :], k, 1)  # q[:, k] and the normalizer's weight k: registers of the thread
            s = s_smem.slice(k, 1, dim=0).load(ACC)  # [1, BLOCK_D]: a thread its J of scores[:D, k]
            acc = gl.fma(gl.expand_dims(gl.convert_layout(qk, TOK), 1), s, acc)
            den = gl.fma(qk, take(s_den, d, k, 0), den)
        y = gl.div_rn(acc, gl.expand_dims(gl.convert_layout(den + eps, TOK), 1))
        n = n0 + gl.arange(0, BLOCK_N, layout=TOK)
        j = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ACC))
        out = out_ptr + bh * D * N + j[None, :] * N + n[:, None]
        gl.store(out, y.to(out_ptr.dtype.element_ty), mask=(n < N)[:, None] & (j < D)[None, :])

    def rows_layout(T: int, J: int, warps: int, block_d: int):
        """The rows kernel's ``[BLOCK_N, BLOCK_D]`` tile of q: a thread holds its T tokens' rows
        whole (the lanes that share tokens alike), tokens' bits as its accumulators' layout has
        them (lanes along the tokens first), so that q's column k is the accumulators' tokens."""
        lj = block_d // J
        tl_ = 32 // lj
        return gl.DistributedLinearLayout([[0, c] for c in bits(block_d)] + [[t, 0] for t in bits(T)],
                                          [[T * t, 0] for t in bits(tl_)] + [[0, 0]] * len(bits(lj)),
                                          [[T * tl_ * w, 0] for w in bits(warps)], [], [T * tl_ * warps, block_d])


def supported_layout(scores, q, eps, dtype) -> bool:
    """can_use without the device check: fp32 scores [B * heads, D + 1, D] for a float q
    [B, heads, D, N], D at most MAX_HEAD_DIM, one device."""
    if not (scores.dim() == 3 and q.dim() == 4 and scores.dtype == torch.float32 and q.dtype in DTYPES
            and dtype in DTYPES and q.numel() > 0 and scores.device == q.device):
        return False
    B, H, D, N = q.shape
    return tuple(scores.shape) == (B * H, D + 1, D) and D <= MAX_HEAD_DIM and B * H < 2 ** 31


def can_use(scores, q, eps, dtype) -> bool:
    return q.is_cuda and supported_layout(scores, q, eps, dtype)


def _block_d(D: int) -> int:
    """head_dim rounded up to a power of two, at least MIN_BLOCK: both kernels' row of outputs."""
    return max(MIN_BLOCK, triton.next_power_of_2(D))


@cached_plan
def _plan(scores, q):
    B, H, D, N = q.shape
    block_d = _block_d(D)
    block_n = max(MIN_BLOCK, min(128, TILE // block_d, triton.next_power_of_2(N)))
    grid = (B * H, triton.cdiv(N, block_n))
    shape, strides = (B, N, H * D), (H * D * N, 1, N)
    consts = dict(D=D, BLOCK_D=block_d, BLOCK_N=block_n)
    return shape, strides, grid, (H, N, *scores.stride(), *q.stride()), consts


def bind(scores, q, eps, dtype):
    """:func:`linear_attention_apply` for inputs of this signature, its host arithmetic done."""
    shape, strides, grid, ints, consts = _plan(scores, q)
    kernel = _linear_attention_apply_kernel.bind(grid, **consts, num_warps=4, enable_fp_fusion=False)
    return fresh_output(kernel, 2, shape, strides, dtype, *ints, float(eps))


# (tokens a thread, outputs of a token a thread, warps) of the rows kernel that first sight tries. With a token's
# outputs all in one thread (J 32 at head_dim 32), the fastest two of 6 on an H100 at Sana's (2, 70, 32, 1024)
# (17.9 and 19.2 us against 29.0 for the kernel above), (2, 70, 32, 4096) and (1, 70, 32, 1024):
# bench/results/runs/linear-attention-probe-h100-e90a58a.json. There an SM's shared-memory reads bound it: each
# thread reads the head's 33 x 32 scores a token (18 us for Sana's 2 x 70 x 1024 tokens). Two tokens a thread and
# 16 or 8 of their outputs: a token's reads halved, its instructions fewer with 16 (1750 against 2312); not yet timed.
ROWS_TILINGS = ((1, 32, 4), (1, 32, 2), (2, 16, 4), (2, 16, 2), (2, 8, 4))
ROWS_MAX_HEAD_DIM = 64  # a thread's rows of q and outputs in registers


def rows_fit(D: int, tiling) -> bool:
    """Whether the rows kernel takes head_dim ``D`` in this tiling: D at most ROWS_MAX_HEAD_DIM, a
    thread's outputs of a token at most D rounded up, a token's threads at most a warp."""
    J, block_d = tiling[1], _block_d(D)
    return D <= ROWS_MAX_HEAD_DIM and J <= block_d and block_d // J <= 32


@cached_plan
def _rows_plan(scores, q, tiling):
    B, H, D, N = q.shape
    T, J, warps = tiling
    block_d = _block_d(D)
    grid = (B * H, triton.cdiv(N, T * (32 * J // block_d) * warps))
    return grid, (H, N, *scores.stride(), *q.stride()), dict(
        D=D, BLOCK_D=block_d, T=T, J=J, QL=rows_layout(T, J, warps, block_d), num_warps=warps)


def bind_rows(scores, q, eps, dtype, tiling):
    """:func:`bind`'s launch of the Gluon rows kernel in ``tiling`` (tokens a thread, outputs of a
    token a thread, warps)."""
    grid, ints, consts = _rows_plan(scores, q, tuple(tiling))
    B, H, D, N = q.shape
    kernel = _linear_attention_apply_rows_kernel.bind(grid, **consts, enable_fp_fusion=False)
    return fresh_output(kernel, 2, (B, N, H * D), (H * D * N, 1, N), dtype, *ints, float(eps))


def variants(scores, q, eps, dtype) -> list:
    """The kernel, and with Gluon the rows kernel in each tiling that takes this head_dim,
    labelled, for first sight to verify and time."""
    found = [("columns", bind(scores, q, eps, dtype))]
    if gluon is not None:
        found += [(f"rows T{t[0]} J{t[1]} w{t[2]}", bind_rows(scores, q, eps, dtype, t)) for t in ROWS_TILINGS
                  if rows_fit(q.shape[2], t)]
    return found


def linear_attention_apply(scores, q, eps, dtype):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(scores, q, eps, dtype)(scores, q)


LINEAR_ATTENTION_APPLY = Impl(run=linear_attention_apply, supports=supported_layout, bind=bind, variants=variants)
