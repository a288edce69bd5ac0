"""Triton sgdiff::linear_attention_out, bitwise equal to eager on CUDA.

One program divides a [BLOCK_I, BLOCK_J] tile of one head's rows by that head's last row (plus
eps, an fp32 sum as eager's), with an IEEE division (``div_rn``, as nvcc compiles ATen's), and
writes it cast, where eager's cast writes it: the output [B, tokens, heads * head_dim] has
strides (heads * head_dim * tokens, 1, tokens), so memory runs like the input's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from sgdiff.kernels.registry import Impl

from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait, fresh_output
from sgdiff.kernels.triton.rows import DTYPES, cached_plan


@LeanKernel
@triton.jit
def _linear_attention_out_kernel(
    h_ptr, out_ptr,
    n_heads: tl.constexpr, D: tl.constexpr, N: tl.constexpr,  # D = head_dim: h has D + 1 rows per head (compiled in)
    sh0, sh1, sh2, sh3,
    eps,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    pid = tl.program_id(0)  # (batch, head), split in 32 bits
    s = pid.to(tl.int64)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    j = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    base = h_ptr + (pid // n_heads).to(tl.int64) * sh0 + (pid % n_heads).to(tl.int64) * sh1
    if D % BLOCK_I == 0 and N % BLOCK_J == 0:  # whole tiles: constant masks, which Triton drops
        mask, col_ok = tl.full([BLOCK_I, BLOCK_J], 1, tl.int1), tl.full([BLOCK_J], 1, tl.int1)
    else:
        mask, col_ok = (i < D)[:, None] & (j < N)[None, :], j < N
    grid_dependency_wait()
    num = tl.load(base + i[:, None] * sh2 + j[None, :] * sh3, mask=mask, other=0.0).to(tl.float32)
    den = tl.load(base + D * sh2 + j * sh3, mask=col_ok, other=1.0).to(tl.float32) + eps
    y = tl.math.div_rn(num, den[None, :])
    tl.store(out_ptr + s * D * N + i[:, None] * N + j[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def supported_layout(h, eps, dtype) -> bool:
    """can_use without the device check: a 4-D fp32 input of at least two rows per head."""
    return h.dim() == 4 and h.dtype == torch.float32 and dtype in DTYPES and h.shape[2] >= 2 and h.numel() > 0


def can_use(h, eps, dtype) -> bool:
    return h.is_cuda and supported_layout(h, eps, dtype)


@cached_plan
def _plan(h):
    B, H, R, N = h.shape
    D = R - 1
    block_i = min(32, triton.next_power_of_2(D))
    # 64 tokens a tile: twice the programs of 128 for Sana's 140 heads (measured: bench/results/README.md)
    block_j = max(16, min(64, 4096 // block_i, triton.next_power_of_2(N)))
    grid = (B * H, triton.cdiv(D, block_i), triton.cdiv(N, block_j))
    shape, strides = (B, N, H * D), (H * D * N, 1, N)
    return shape, strides, grid, (H, D, N, *h.stride()), dict(BLOCK_I=block_i, BLOCK_J=block_j)


def bind(h, eps, dtype):
    """:func:`linear_attention_out` for inputs of this signature, its host arithmetic done."""
    shape, strides, grid, ints, blocks = _plan(h)
    kernel = _linear_attention_out_kernel.bind(grid, **blocks, num_warps=4, enable_fp_fusion=False)
    return fresh_output(kernel, 1, shape, strides, dtype, *ints, float(eps))


def linear_attention_out(h, eps, dtype):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(h, eps, dtype)(h)


LINEAR_ATTENTION_OUT = Impl(run=linear_attention_out, supports=supported_layout, bind=bind)
