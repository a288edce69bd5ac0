"""Attention operands as e4m3 copies, and an e4m3 attention output restored (sgdiff::attention_fp8).

:func:`quantize_operands` makes cuDNN's FP8 attention's inputs from q, k, v ``[B, H, S, D]``
(any strides with unit stride along D: diffusers' ``[B, S, H, D]`` projections viewed
heads-first): the scales and means by ATen (:func:`sgdiff.kernels.attention_fp8.operand_scales`,
the reference's own calls: on the device, no host synchronization), then
:func:`_quantize_heads_kernel` once per operand: a tile of tokens of one head, less its mean (k,
v) in fp32, divided by the scale (IEEE division; one for the tensor, or per channel for v),
rounded to e4m3, stored in a contiguous ``[B, S, H, D]`` copy (or the first ``S`` tokens of a
longer one whose other tokens are zeros: a geometry cuDNN takes only padded). :func:`restore_heads`
turns the e4m3 output back: times v's channel scale plus its mean in fp32 (ptxas may contract the
two into one fma: within the op's contract), one rounding to the output dtype, ``[B, S, H, D]``.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgdiff.kernels.attention_fp8 import operand_scales
from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX
from sgdiff.kernels.triton.attention_int8 import centred_tokens
from sgdiff.kernels.triton.cuda_math import to_e4m3
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait

BLOCK_S = 64  # tokens a program


@triton.jit
def _heads_offsets(bh, rows, cols, H, S, D: tl.constexpr):
    """Offsets of tokens ``rows`` of head ``bh`` in a contiguous ``[B, S, H, D]`` tensor (``S``:
    its tokens)."""
    b, h = bh // H, bh % H
    return ((b.to(tl.int64) * S + rows[:, None]) * H + h) * D + cols[None, :]


@LeanKernel
@triton.jit
def _quantize_heads_kernel(
    x_ptr, mean_ptr, scale_ptr, out_ptr,
    H, S, SO,  # SO: the copy's tokens (S, or more: padding)
    sxb, sxh, sxs,
    D: tl.constexpr, BLOCK: tl.constexpr, PER_CHANNEL: tl.constexpr, E4M3_MAX_: tl.constexpr,
):
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    grid_dependency_wait()
    x = centred_tokens(x_ptr, mean_ptr, bh, rows, cols, H, S, sxb, sxh, sxs, D)
    if PER_CHANNEL:
        scale = tl.broadcast_to(tl.load(scale_ptr + bh * D + cols)[None, :], (BLOCK, D))
    else:
        scale = tl.load(scale_ptr)
    y = tl.math.div_rn(x, scale)
    y = tl.minimum(tl.maximum(y, -E4M3_MAX_), E4M3_MAX_)
    tl.store(out_ptr + _heads_offsets(bh, rows, cols, H, SO, D), to_e4m3(y), mask=(rows < S)[:, None])


@LeanKernel
@triton.jit
def _restore_heads_kernel(o8_ptr, mean_ptr, scale_ptr, out_ptr, H, S, SI, D: tl.constexpr, BLOCK: tl.constexpr):
    """``S`` tokens out of ``o8``'s ``SI`` (S, or more: padding)."""
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    offsets, inside = _heads_offsets(bh, rows, cols, H, S, D), (rows < S)[:, None]
    grid_dependency_wait()
    o = tl.load(o8_ptr + _heads_offsets(bh, rows, cols, H, SI, D), mask=inside, other=0.0).to(tl.float32)
    out = o * tl.load(scale_ptr + bh * D + cols)[None, :] + tl.load(mean_ptr + bh * D + cols)[None, :]
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=inside)


def quantize_heads(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor,
                   tokens: Optional[int] = None) -> torch.Tensor:
    """``x`` ``[B, H, S, D]`` less ``mean`` (``[B, H, 1, D]`` fp32) over ``scale`` (0-dim, or
    ``[B, H, D]`` per channel) as e4m3, in a contiguous ``[B, tokens, H, D]`` tensor (``tokens``:
    S, or more, the others zeros)."""
    b, h, s, d = x.shape
    tokens = s if tokens is None else tokens
    out = torch.empty((b, tokens, h, d), dtype=E4M3, device=x.device)
    if tokens > s:
        out[:, s:].zero_()
    _quantize_heads_kernel[(triton.cdiv(s, BLOCK_S), b * h)](
        x, mean.reshape(b * h, d).contiguous(), scale.contiguous(), out, h, s, tokens, *x.stride()[:3], D=d,
        BLOCK=BLOCK_S, PER_CHANNEL=scale.dim() > 0, E4M3_MAX_=E4M3_MAX, num_warps=4)
    return out


def restore_heads(o8: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                  tokens: Optional[int] = None) -> torch.Tensor:
    """The first ``tokens`` (default: all) of ``o8`` (contiguous ``[B, S, H, D]`` e4m3) times
    ``scale`` plus ``mean`` (both per channel of a head, ``[B, H, D]`` and ``[B, H, 1, D]``
    fp32), as ``dtype`` ``[B, tokens, H, D]``."""
    b, s_in, h, d = o8.shape
    s = s_in if tokens is None else tokens
    out = torch.empty((b, s, h, d), dtype=dtype, device=o8.device)
    _restore_heads_kernel[(triton.cdiv(s, BLOCK_S), b * h)](
        o8, mean.reshape(b * h, d).contiguous(), scale.reshape(b * h, d).contiguous(), out, h, s, s_in, D=d,
        BLOCK=BLOCK_S, num_warps=4)
    return out


def quantize_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_tokens: Optional[int] = None,
                      k_tokens: Optional[int] = None):
    """``(q8, k8, v8, q_scale, k_scale, v_mean, v_scale)``: the three e4m3 copies ``[B, S, H, D]``
    (padded with zeros to ``q_tokens`` and ``k_tokens`` where given) and what restores their
    product (:func:`sgdiff.kernels.attention_fp8.quantized_operands`'s values, in cuDNN's layout)."""
    q_scale, k_mean, k_scale, v_mean, v_scale = operand_scales(q, k, v)
    zeros = torch.zeros((q.shape[0], q.shape[1], 1, q.shape[3]), dtype=torch.float32, device=q.device)
    return (quantize_heads(q, zeros, q_scale, q_tokens), quantize_heads(k, k_mean, k_scale, k_tokens),
            quantize_heads(v, v_mean, v_scale, k_tokens), q_scale, k_scale, v_mean, v_scale)
