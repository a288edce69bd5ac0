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
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cast_copy import relu_as_aten
from sgdiff.kernels.triton.launch import LeanKernel, fresh_output, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan

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
    for k in tl.static_range(D):  # k in increasing order
        qk = tl.sum(tl.where(d[None, :] == k, q, -0.0), axis=1)  # q[:, k], exactly
        s = tl.load(s_head + d * ss1 + k * ss2, mask=d_ok, other=0.0)  # scores[:D, k]
        acc = tl.fma(qk[:, None], s[None, :], acc)
        den = tl.fma(qk, tl.load(s_head + D * ss1 + k * ss2), den)
    y = tl.math.div_rn(acc, (den + eps)[:, None])
    out = out_ptr + bh * D * N + d[None, :] * N + n[:, None]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])


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


@cached_plan
def _plan(scores, q):
    B, H, D, N = q.shape
    block_d = max(MIN_BLOCK, triton.next_power_of_2(D))
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


def linear_attention_apply(scores, q, eps, dtype):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(scores, q, eps, dtype)(scores, q)


LINEAR_ATTENTION_APPLY = Impl(run=linear_attention_apply, supports=supported_layout, bind=bind)
