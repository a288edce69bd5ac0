"""sgdiff::attention_fp8 — scaled dot-product attention as cuDNN's FP8 (e4m3) attention (the
``high`` tier).

Eager chain it stands for (``F.scaled_dot_product_attention`` without a mask or dropout; q, k, v
``[B, H, S, D]``)::

    out = softmax(q @ k.transpose(-2, -1) * scale) @ v

This op is **not** that chain: every operand of both products is e4m3 (3 mantissa bits), as
cuDNN's FP8 attention on Hopper takes them (one scale per tensor for q and k; P, scaled by 448,
and the output in e4m3 too):

- q scaled to e4m3's range as a whole (multiplied by the IEEE inverse of its scale, ``largest
  magnitude / 448``; round to nearest even);
- k smoothed first (the centre of its range over the tokens, ``(max + min) / 2`` per batch,
  head and channel, subtracted in fp32: every score of a query row moves by the same amount,
  which the softmax ignores; of all the constants a channel could lose, the centre leaves it
  the smallest largest magnitude, so the finest scale), then scaled as a whole;
- v smoothed by its mean over the tokens instead (:func:`tiled_token_means`) and scaled per
  channel of a head (a softmax row sums to one and the product is linear in each channel of v,
  so both come back exactly after the kernel: the output channel times its scale, plus the
  mean) — cuDNN sees v's e4m3 copy with a unit scale. The output lies near v's mean where
  attention is diffuse, and its own e4m3 rounding is relative to its distance from what was
  taken out: the mean keeps it small;
- the scores ``q8 k8^T`` accumulated in fp32 times the two scales and ``scale``; softmax in
  fp32; ``exp(s - max)`` times 448 rounded to e4m3 and multiplied by v's copy with fp32
  accumulation, divided by the row's sum and rounded to e4m3 (every output lies within v's
  copy's ±448); times v's channel scale plus its mean in fp32, one rounding to q's dtype.

Every statistic but v's mean is a largest or smallest value (k's centre and half-range one IEEE
addition, halving and subtraction of two of them), so any order of reduction gives the same bits;
v's mean sums each tile of 64 tokens in token order (:func:`tile_sums`: an order a kernel can
keep) and the tiles' sums by ATen. The Triton kernels compute all of them in one pass over each
operand and equal this reference exactly on the same device.

The reference is that math with the softmax over a whole row (cuDNN's online softmax shifts by a
running maximum: another order of the same math, which moves where P is rounded). Contract
``approx``: each operand carries a relative error up to 2^-4; what that costs over a trajectory
is bench/tiers.py's figure. Output in ``[B, S, H, D]`` memory order, as FlashAttention's. The
kernel (:mod:`sgdiff.kernels.cudnn.attention_fp8`) needs the ``nvidia-cudnn-frontend`` package
and Hopper; the ``int8_attention`` family reaches it through ``attention_int8``'s first sight,
which times it against the INT8 kernel and the unquantized attention and keeps the fastest.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.attention import LOW_PRECISION_EXAMPLES, heads_last
from sgdiff.kernels.attention_int8 import channels_around
from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX, SCALE_FLOOR, divide
from sgdiff.kernels.registry import KernelSpec, OpDef
from sgdiff.tiers import Contract

P_SCALE = E4M3_MAX  # P (at most 1 after the shift) times this before its rounding to e4m3


def takes_head_dim(d: int) -> bool:
    """Head dims cuDNN's FP8 attention takes on Hopper: multiples of 16 up to 256."""
    return d % 16 == 0 and 16 <= d <= 256


def tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """One fp32 scale (0-dim) for all of ``x``: ``max(amax, SCALE_FLOOR) / 448``, the largest
    magnitude from ATen's ``aminmax`` (no copy of ``x`` is made)."""
    low, high = torch.aminmax(x)
    return divide(torch.clamp_min(torch.maximum(high.float(), -low.float()), SCALE_FLOOR), E4M3_MAX)


def channel_ranges(x: torch.Tensor):
    """``(centre, scale)`` of ``x`` ``[B, H, S, D]`` per channel of a head: the centre of its range
    over the tokens ``(max + min) / 2`` in fp32 ``[B, H, 1, D]``, and ``max(half-range,
    SCALE_FLOOR) / 448`` ``[B, H, D]``, the half-range being ``max(max - centre, centre - min)``:
    the largest magnitude of the channel less its centre (fp32 rounding is monotonic)."""
    low, high = torch.aminmax(x, dim=2)
    low, high = low.float(), high.float()
    centre = (high + low) * 0.5
    amax = torch.maximum(high - centre, centre - low)
    return centre[:, :, None], divide(amax.clamp_min(SCALE_FLOOR), E4M3_MAX)


MEAN_TILE = 64  # tokens summed in order as one tile in :func:`tiled_token_means`


def tile_sums(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, S, D]`` summed in fp32 over each tile of :data:`MEAN_TILE` tokens
    ``[B, H, ceil(S / MEAN_TILE), D]`` (contiguous), in token order: the first token, plus the
    second, plus the third, ... (the tokens past S are +0). Each step is one IEEE addition, so a
    kernel that adds the same tokens in the same order gets the same bits (and can add each
    token as it loads it, one vector a token)."""
    b, h, s, d = x.shape
    tiles = -(-s // MEAN_TILE)
    t = torch.nn.functional.pad(x.float(), (0, 0, 0, tiles * MEAN_TILE - s)).view(b, h, tiles, MEAN_TILE, d)
    total = t[:, :, :, 0]
    for token in range(1, MEAN_TILE):
        total = total + t[:, :, :, token]
    return total.contiguous()


def tiled_token_means(x: torch.Tensor) -> torch.Tensor:
    """``x``'s mean over the tokens in fp32 ``[B, H, 1, D]``: :func:`tile_sums`, their sum by
    ATen (one ``sum`` of a small contiguous tensor: the same kernel and the same bits for a
    kernel's tile sums on the same device), over the tokens (IEEE division)."""
    return divide(tile_sums(x).sum(dim=2, keepdim=True), x.shape[2])


def operand_scales(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``(q_scale, k_centre, k_scale, v_mean, v_scale)``: q's and smoothed k's one scale each
    (0-dim), k's centres (:func:`channel_ranges`) and v's means over the tokens
    (:func:`tiled_token_means`) ``[B, H, 1, D]``, and v's scale per channel of a head ``[B, H, D]``
    (:func:`sgdiff.kernels.attention_int8.channels_around`; smoothed k's largest magnitude is the largest of its channels', so
    its scale is their largest scale)."""
    k_centre, k_scales = channel_ranges(k)
    v_mean, v_scale = channels_around(v, tiled_token_means(v))
    return tensor_scale(q), k_centre, k_scales.amax(), v_mean, v_scale


def inverse_of(scale: torch.Tensor) -> torch.Tensor:
    """What an operand's values are multiplied by: ``1 / scale``, one IEEE division a scale."""
    return torch.ones_like(scale) / scale


def quantize_reference(x: torch.Tensor, centre: Optional[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """``round_e4m3(clamp((x - centre) * inverse_of(scale), ±448))`` in fp32 (``centre`` ``[B, H,
    1, D]`` or None; ``scale`` 0-dim, or ``[B, H, D]`` per channel): a product with the scale's
    inverse, not a division a value (the kernel's: a division is many instructions)."""
    x = x.float() if centre is None else x.float() - centre
    return (x * inverse_of(scale if scale.dim() == 0 else scale[:, :, None])).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantized_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """What the kernel is handed, heads-first ``[B, H, S, D]``: ``(q8, q_scale, k8, k_scale, v8,
    v_mean, v_scale)``."""
    q_scale, k_centre, k_scale, v_mean, v_scale = operand_scales(q, k, v)
    return (quantize_reference(q, None, q_scale), q_scale, quantize_reference(k, k_centre, k_scale), k_scale,
            quantize_reference(v, v_mean, v_scale), v_mean, v_scale)


def restore_values(o8: torch.Tensor, v_mean: torch.Tensor, v_scale: torch.Tensor, dtype: torch.dtype):
    """The e4m3 product ``o8`` ``[B, H, S, D]`` back in v's units: times v's channel scale, plus
    its mean (fp32), one rounding to ``dtype``."""
    return (o8.float() * v_scale[:, :, None] + v_mean).to(dtype)


def attention_fp8_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                            scale: Optional[float]) -> torch.Tensor:
    q8, q_scale, k8, k_scale, v8, v_mean, v_scale = quantized_operands(q, k, v)
    sm_scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q8.float() @ k8.float().transpose(-1, -2) * (q_scale * k_scale) * sm_scale
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p8 = (e * P_SCALE).to(E4M3)
    o = (p8.float() @ v8.float()) / (e.sum(dim=-1, keepdim=True) * P_SCALE)
    o8 = o.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return heads_last(restore_values(o8, v_mean, v_scale, q.dtype))


attention_fp8 = dispatch.define_op(OpDef(
    "attention_fp8", Contract.APPROX, attention_fp8_reference,
    impls=(KernelSpec("", "cudnn", None, "sgdiff.kernels.cudnn.attention_fp8:ATTENTION_FP8",
                      devices=frozenset({"cuda"}), dtypes=frozenset({"float16", "bfloat16"}),
                      min_capability=(9, 0), priority=10),),
    examples=LOW_PRECISION_EXAMPLES,
    doc="softmax(q k^T * scale) v as cuDNN's FP8 attention computes it: q and k (smoothed: the centre of "
        "each channel's range over the tokens subtracted) each scaled to e4m3 as a whole, v smoothed by its "
        "mean over the tokens and scaled to e4m3 per channel of a head, the scores in fp32, softmax in fp32, "
        "448 P in e4m3 times v's copy accumulated in fp32, the output rounded to e4m3, then scaled back and "
        "v's mean added in fp32, one rounding to q's dtype. Operand relative error up to 2^-4; no mask, no "
        "dropout. Output in [B, S, H, D] memory order",
))
