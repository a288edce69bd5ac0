"""sgdiff::attention_int8 — scaled dot-product attention with q k^T as an INT8 product (the ``high``
tier).

Eager chain it stands for (``F.scaled_dot_product_attention`` without a mask, dropout or a
causal mask; q, k, v ``[B, H, S, D]``)::

    out = softmax(q @ k.transpose(-2, -1) * scale) @ v

This op is **not** that chain: k is first smoothed (its mean over the tokens, per batch, head
and channel, subtracted in fp32: every score of a query row moves by the same amount, which the
softmax ignores, and the values left to quantize are smaller), then q and the smoothed k are
quantized to int8 per block of :data:`Q_BLOCK` / :data:`K_BLOCK` tokens of one head (the
block's largest magnitude to 127, rounded half away from zero); the scores are the integer
product (exact: in int32 on the tensor cores, and in fp32 too, every partial sum below 2^24)
times the two blocks' scales and ``scale``; softmax in fp32; P rounded to v's dtype and
multiplied by v with fp32 accumulation (as FlashAttention does). The reference is that math with
the softmax and ``P @ v`` in fp32 (the kernel's online softmax rounds P per key tile: another
order of the same math). Contract ``approx``. As SageAttention does: INT8 rather than e4m3 for
q k^T, whose 3 mantissa bits cost three times the error on random heads (measured on the CPU,
300 tokens, head dims 64 and 128, k's spread 0.5 to 3: 0.7-2.6% of exact attention's norm for
INT8, 1.9-7.5% for e4m3 with the same blocks), at the same tensor-core rate on Hopper.
Output in ``[B, S, H, D]`` memory order, as FlashAttention's.

Where it is faster, ``P @ v`` runs in e4m3 too, at twice the bf16 rate (the FP8 product
FlashAttention-3 and SageAttention2 use): v smoothed as k is (its mean over the tokens, per
channel of a head, subtracted in fp32: a softmax row sums to one, so the mean comes back as an
addend of the output) and quantized per channel of a head (that channel's largest magnitude to
448, :func:`quantize_values_reference`); P, at most 1 after the online softmax's shift, scaled
by 448 and rounded to e4m3; each key tile's product summed in fp32. Its reference
(:func:`attention_int8_fp8_values_reference`) is the INT8 scores' softmax in fp32 times those
e4m3 values: the kernel departs from it by P's rounding alone.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.attention import LOW_PRECISION_EXAMPLES, heads_last
from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX, SCALE_FLOOR, divide
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

Q_BLOCK = 128  # query tokens sharing one scale (a program's tile)
K_BLOCK = 128  # key tokens sharing one scale
HEAD_DIMS = (32, 64, 128)  # what the kernel's tiles take
INT8_MAX = 127.0


def token_means(x: torch.Tensor) -> torch.Tensor:
    """``x``'s mean over the tokens, per batch, head and channel, in fp32 ``[B, H, 1, D]``."""
    return torch.mean(x, dim=2, keepdim=True, dtype=torch.float32)


def smoothed_keys(k: torch.Tensor) -> torch.Tensor:
    """``k`` in fp32 less :func:`token_means`."""
    return k.float() - token_means(k)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest integer, halves away from zero (``x + 0.5`` is exact below 2^22)."""
    return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))


def quantize_blocks_reference(x: torch.Tensor, block: int):
    """``(q, scale)``: ``x`` ``[B, H, S, D]`` (fp32) as int8 per block of ``block`` tokens of one
    head, scales ``[B, H, ceil(S / block)]`` (``max(amax, SCALE_FLOOR) / 127``)."""
    b, h, s, d = x.shape
    pad = (-s) % block
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(b, h, -1, block, d)
    scale = divide(xp.abs().amax(dim=(3, 4)).clamp_min(SCALE_FLOOR), INT8_MAX)
    q = round_half_away(xp / scale[..., None, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.view(b, h, -1, d)[:, :, :s], scale


def value_channels_reference(v: torch.Tensor):
    """``(mean, scale)`` of ``v`` ``[B, H, S, D]``: its fp32 mean over the tokens ``[B, H, 1, D]``
    and, per channel of a head, ``max(largest |v - mean|, SCALE_FLOOR) / 448`` ``[B, H, D]``: the
    largest magnitude is that of the channel's largest or smallest value less the mean."""
    return channels_around(v, token_means(v))


def channels_around(v: torch.Tensor, mean: torch.Tensor):
    """``(mean, scale)``: ``mean`` ``[B, H, 1, D]`` and, per channel of a head, ``max(largest
    |v - mean|, SCALE_FLOOR) / 448`` ``[B, H, D]``, the largest magnitude being that of the
    channel's largest or smallest value less the mean."""
    low, high = torch.aminmax(v, dim=2)
    amax = torch.maximum(high.float() - mean[:, :, 0], mean[:, :, 0] - low.float())
    return mean, divide(amax.clamp_min(SCALE_FLOOR), E4M3_MAX)


def quantize_reference(x: torch.Tensor, mean: Optional[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """``round_e4m3(clamp((x - mean) / scale, ±448))`` in fp32 (``mean`` ``[B, H, 1, D]`` or
    None; ``scale`` 0-dim, or ``[B, H, D]`` per channel)."""
    x = x.float() if mean is None else x.float() - mean
    scale = scale if scale.dim() == 0 else scale[:, :, None]
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_values_reference(v: torch.Tensor):
    """``(v8, mean, scale)``: ``v`` less its mean, divided by its channel's scale, as e4m3
    ``[B, H, S, D]`` (:func:`value_channels_reference`)."""
    mean, scale = value_channels_reference(v)
    return quantize_reference(v, mean, scale), mean, scale


def _int8_scores(q, k, scale):
    """The INT8 product's scores, fp32 ``[B, H, S_q, S_k]``, times ``scale``."""
    d = q.shape[-1]
    sm_scale = d ** -0.5 if scale is None else scale
    q8, qs = quantize_blocks_reference(q.float(), Q_BLOCK)
    k8, ks = quantize_blocks_reference(smoothed_keys(k), K_BLOCK)
    s = q8.float() @ k8.float().transpose(-1, -2)
    s = s * qs.repeat_interleave(Q_BLOCK, -1)[..., :q.shape[2], None] * ks.repeat_interleave(K_BLOCK, -1)[
        ..., None, :k.shape[2]] * sm_scale
    return s


def attention_int8_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                            scale: Optional[float]) -> torch.Tensor:
    s = _int8_scores(q, k, scale)
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    out = torch.softmax(s, dim=-1) @ v.float()
    return heads_last(out.to(q.dtype))


def attention_int8_fp8_values_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                        scale: Optional[float]) -> torch.Tensor:
    """The op with ``P @ v`` in e4m3: the INT8 scores' softmax in fp32 times v's e4m3 copy
    (:func:`quantize_values_reference`) and its scales, plus v's mean (not causal)."""
    v8, mean, v_scale = quantize_values_reference(v)
    out = torch.softmax(_int8_scores(q, k, scale), dim=-1) @ v8.float() * v_scale[:, :, None] + mean
    return heads_last(out.to(q.dtype))


attention_int8 = dispatch.define_op(OpDef(
    "attention_int8", Contract.APPROX, attention_int8_reference,
    impls=(triton("attention_int8", dtypes=frozenset({"float16", "bfloat16"}), min_capability=(8, 9)),),
    examples=LOW_PRECISION_EXAMPLES,
    doc="softmax(q k^T * scale) v with k smoothed (its mean over the tokens subtracted), q and k quantized "
        "to int8 per block of 128 tokens of a head, q k^T exact in int32, softmax in fp32, P in v's "
        "dtype times v accumulated in fp32 (or, where faster, P and the smoothed v in e4m3: v per "
        "channel of a head); no mask, no dropout, not causal on the GPU. Output in [B, S, H, D] memory order",
))
