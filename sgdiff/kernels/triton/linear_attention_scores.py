"""Triton sgdiff::linear_attention_scores, bitwise equal to eager on CUDA.

One program computes one head's [head_dim + 1, head_dim] scores: each one fp32 accumulator
taking the tokens' products in increasing order, each a fused multiply-add (cuBLAS's order for
these fp32 shapes: no split-K); the last row's factor is the padding value itself. A token's v
column and k row are each head_dim adjacent channels of their projections (the transposed views
Sana's processor makes), read once, ReLU'd (k, as ATen's) and widened in registers. The tokens
go in steps of ``UNROLL`` whose loads are issued together, then the rest one by one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cast_copy import relu_as_aten
from sgdiff.kernels.triton.launch import LeanKernel, fresh_output, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan

MAX_HEAD_DIM = 64  # a [head_dim, head_dim] accumulator in one program's registers
UNROLL = 8


@triton.jit
def _fold_token(acc, den, v_rows, k_cols, n, sv3, sk2, value, r_ok, c_ok):
    """The scores after token n: each accumulator's FMA with v[r, n] * relu(k)[n, c]."""
    vn = tl.load(v_rows + n * sv3, mask=r_ok, other=0.0).to(tl.float32)
    kn = relu_as_aten(tl.load(k_cols + n * sk2, mask=c_ok, other=0.0).to(tl.float32))
    return tl.fma(vn[:, None], kn[None, :], acc), tl.fma(value, kn, den)


@LeanKernel
@triton.jit
def _linear_attention_scores_kernel(
    v_ptr,  # [B, heads, D, N]
    k_ptr,  # [B, heads, N, D]
    out_ptr,  # [B * heads, D + 1, D] fp32, contiguous
    n_heads, N,
    sv0, sv1, sv2, sv3,
    sk0, sk1, sk2, sk3,
    value,  # the padding row's value (fp32)
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UNROLL: tl.constexpr,
):
    pid = tl.program_id(0)  # (batch, head)
    r = tl.arange(0, BLOCK_D)
    r_ok = r < D
    b, h = (pid // n_heads).to(tl.int64), (pid % n_heads).to(tl.int64)
    v_rows = v_ptr + b * sv0 + h * sv1 + r * sv2
    k_cols = k_ptr + b * sk0 + h * sk1 + r * sk3
    grid_dependency_wait()
    acc = tl.zeros([BLOCK_D, BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_D], tl.float32)
    full = N - N % UNROLL
    for n0 in range(0, full, UNROLL):  # the tokens in increasing order
        for t in tl.static_range(UNROLL):
            acc, den = _fold_token(acc, den, v_rows, k_cols, n0 + t, sv3, sk2, value, r_ok, r_ok)
    for n in range(full, N):
        acc, den = _fold_token(acc, den, v_rows, k_cols, n, sv3, sk2, value, r_ok, r_ok)
    out = out_ptr + pid.to(tl.int64) * (D + 1) * D
    tl.store(out + r[:, None] * D + r[None, :], acc, mask=r_ok[:, None] & r_ok[None, :])
    tl.store(out + D * D + r, den, mask=r_ok)


def supported_layout(v, k, value) -> bool:
    """can_use without the device check: v [B, heads, D, N] and k [B, heads, N, D] of one float
    dtype and device, D at most MAX_HEAD_DIM, a head's tokens within 32-bit offsets."""
    if not (v.dim() == 4 and k.dim() == 4 and v.dtype in DTYPES and k.dtype == v.dtype and v.numel() > 0
            and k.device == v.device):
        return False
    B, H, D, N = v.shape
    return (tuple(k.shape) == (B, H, N, D) and D <= MAX_HEAD_DIM and B * H < 2 ** 31
            and N * max(abs(v.stride(3)), abs(k.stride(2))) < 2 ** 31)  # a head's token offsets in 32 bits


def can_use(v, k, value) -> bool:
    return v.is_cuda and supported_layout(v, k, value)


@cached_plan
def _plan(v, k):
    B, H, D, N = v.shape
    out = (B * H, D + 1, D), ((D + 1) * D, D, 1)  # contiguous, as eager's bmm writes it
    return (B * H,), out, (H, N, *v.stride(), *k.stride()), dict(D=D, BLOCK_D=triton.next_power_of_2(D))


def bind(v, k, value):
    """:func:`linear_attention_scores` for inputs of this signature, its host arithmetic done."""
    grid, (shape, strides), ints, consts = _plan(v, k)
    kernel = _linear_attention_scores_kernel.bind(grid, **consts, UNROLL=UNROLL, num_warps=4, enable_fp_fusion=False)
    return fresh_output(kernel, 2, shape, strides, torch.float32, *ints, float(value))


def linear_attention_scores(v, k, value):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(v, k, value)(v, k)


LINEAR_ATTENTION_SCORES = Impl(run=linear_attention_scores, supports=supported_layout, bind=bind)
