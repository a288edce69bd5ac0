"""Triton sgdiff::linear_attention_apply, bitwise equal to eager on CUDA.

One program computes a [head_dim, BLOCK_N] tile of one head's ``h = scores @ relu(q)`` and the
tile's normalizer row, each element one fp32 accumulator taking head_dim fused multiply-adds
in increasing k (cuBLAS's order for these fp32 shapes: no split-K), then divides by the
normalizer plus eps (``div_rn``, as ATen's division) and writes the result cast, where eager's
cast writes it: [B, tokens, heads * head_dim] with strides (heads * head_dim * tokens, 1,
tokens). The products are fp32 ``tl.dot`` calls at IEEE precision, ``BLOCK_K`` values of k at a
time, of the head's scores (the normalizer row among them) and a tile of q read through its
strides (the query projection's transposed view: a token's head_dim channels adjacent, so a
token's are one load), ReLU'd as ATen's and widened in registers. Triton lowers an fp32 dot at
IEEE precision to FMAs (no tensor core takes fp32 at IEEE precision), each output's chain in
increasing k from the accumulator it is given: the order above. The normalizer is taken out of
its row by a sum of it and zeros, which is exact: a chain of FMAs from +0 never ends at -0.
h never reaches memory.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cast_copy import relu_as_aten
from sgdiff.kernels.triton.launch import LeanKernel, fresh_output, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan

MAX_HEAD_DIM = 128  # a [head_dim, BLOCK_N] accumulator in registers
MIN_DOT = 16  # tl.dot's smallest extent
MAX_BLOCK_K = 32  # k a step: the scores' and q's tiles stay small at head_dim 128


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
    BLOCK_M: tl.constexpr,  # the scores' D rows and the normalizer row
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,  # k a step
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)  # (batch, head), split in 32 bits
    bh = pid.to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    s_rows = scores_ptr + bh * ss0 + m[:, None] * ss1
    q_cols = q_ptr + (pid // n_heads).to(tl.int64) * sq0 + (pid % n_heads).to(tl.int64) * sq1 + n[None, :] * sq3
    grid_dependency_wait()
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.static_range(0, BLOCK_D, BLOCK_K):  # k in increasing order, BLOCK_K at a time
        kk = k0 + k
        s = tl.load(s_rows + kk[None, :] * ss2, mask=(m <= D)[:, None] & (kk < D)[None, :], other=0.0)
        q = tl.load(q_cols + kk[:, None] * sq2, mask=(kk < D)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(s, relu_as_aten(q.to(tl.float32)), acc, input_precision="ieee")
    den = tl.sum(tl.where((m == D)[:, None], acc, 0.0), axis=0)
    y = tl.math.div_rn(acc, (den + eps)[None, :])
    out = out_ptr + bh * D * N + m[:, None] * N + n[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=(m < D)[:, None] & n_ok[None, :])


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
    block_m, block_d = max(MIN_DOT, triton.next_power_of_2(D + 1)), max(MIN_DOT, triton.next_power_of_2(D))
    block_n = max(MIN_DOT, min(128, 8192 // block_m, triton.next_power_of_2(N)))
    grid = (B * H, triton.cdiv(N, block_n))
    shape, strides = (B, N, H * D), (H * D * N, 1, N)
    consts = dict(D=D, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_K=min(block_d, MAX_BLOCK_K), BLOCK_N=block_n)
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
