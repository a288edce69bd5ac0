"""sgdiff::attention — scaled dot-product attention by whichever of torch's fused kernels is
fastest for the signature (the ``extra-high`` tier).

Eager chain it replaces (``F.scaled_dot_product_attention`` without a mask or dropout, as ATen
traces it on CUDA: the kernel torch's selector picked; cuDNN's on Hopper with torch 2.11)::

    out = softmax(q @ k.transpose(-2, -1) * scale) @ v        # q, k, v: [B, H, S, D]

This op computes the same attention with the same operand precision (16-bit q, k, v and P, fp32
accumulation and softmax), by the fastest of the fused kernels torch has for the signature:
cuDNN's (a Hopper kernel of its own), FlashAttention-2 and the memory-efficient one, timed
against each other at first sight, eager's own first (kept unless another is faster by the
margin: then the bits are eager's). The others differ from eager's kernel only in accumulation
order and where P is rounded, hence contract ``close``. Its output is in ``[B, S, H, D]`` memory
order (a ``[B, H, S, D]`` view), as FlashAttention's is. The reference is
``F.scaled_dot_product_attention`` (on the CPU: ATen's own kernel).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import KernelSpec, OpDef
from sgdiff.tiers import Contract


def heads_last(out: torch.Tensor) -> torch.Tensor:
    """``out`` ``[B, H, S, D]`` in ``[B, S, H, D]`` memory order (a copy only where it is not)."""
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                        scale: Optional[float]) -> torch.Tensor:
    return heads_last(F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale))


def qkv(t):
    """q, k, v as diffusers hands them to SDPA: ``[B, S, H, D]`` projections viewed ``[B, H, S, D]``."""
    return tuple(t.randn(t.B, t.S, t.H, t.D).transpose(1, 2) for _ in range(3))


def _sdpa_chain(q, k, v, is_causal, scale):
    """The eager chain of a lower-precision attention: torch's fused attention kernel (what the
    kernel bench times such an op against)."""
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def _cross_qkv(t):
    """q of ``S`` tokens, k and v of ``T`` (a text stream), diffusers' ``[B, S, H, D]`` views."""
    return tuple(t.randn(t.B, n, t.H, t.D).transpose(1, 2) for n in (t.S, t.T, t.T))


#: the examples of the lower-precision attention ops (``attention_int8``, ``attention_fp8``): their
#: references' fp32 scores at Wan's 32760 self-attention tokens would take 51 GB, so Wan comes as
#: its cross-attention (the GPU tests time its self-attention against eager's kernel)
LOW_PRECISION_EXAMPLES = (
    Example("Flux.1-dev joint attention", dict(B=1, S=4608, H=24, D=128),
            lambda t: (*qkv(t), False, None), small=dict(S=200, H=2, D=64), chain=_sdpa_chain),
    Example("Wan 2.1 1.3B cross-attention, 480p x 81 over 512 text tokens", dict(B=1, S=32760, T=512, H=12, D=128),
            lambda t: (*_cross_qkv(t), False, None), small=dict(S=130, T=70, H=1, D=128), chain=_sdpa_chain),
)


attention = dispatch.define_op(OpDef(
    "attention", Contract.CLOSE, attention_reference,
    impls=(KernelSpec("", "sdpa", None, "sgdiff.kernels.sdpa:ATTENTION", devices=frozenset({"cuda"}),
                      dtypes=frozenset({"float16", "bfloat16"}), priority=10),),
    examples=(
        Example("Flux.1-dev joint attention", dict(B=1, S=4608, H=24, D=128),
                lambda t: (*qkv(t), False, None), small=dict(S=64, H=2, D=64), bench=False),
        Example("Wan 2.1 1.3B self-attention, 480p x 81", dict(B=1, S=32760, H=12, D=128),
                lambda t: (*qkv(t), False, None), small=dict(S=64, H=2, D=64), bench=False),
    ),
    doc="softmax(q k^T * scale) v (no mask, no dropout) by the fastest of torch's fused 16-bit attention "
        "kernels for the signature (cuDNN, FlashAttention-2, memory-efficient), timed at first sight; "
        "output in [B, S, H, D] memory order. Same operand precision as eager's kernel, another "
        "accumulation order",
))
