"""Attention operands as e4m3 copies, and an e4m3 attention output restored (sgdiff::attention_fp8).

:func:`quantize_operands` makes cuDNN's FP8 attention's inputs from q, k, v ``[B, H, S, D]``
(any strides with unit stride along D: diffusers' ``[B, S, H, D]`` projections viewed
heads-first) in two passes over each operand, on the device (no host synchronization):

1. :func:`channel_ranges`: :func:`_ranges_kernel` takes each channel's smallest and largest
   value over a tile of tokens of one head (for v, :func:`_ranges_sums_kernel`, which also sums
   the tile's tokens in order, loading and adding one token at a time),
   :func:`_finish_ranges_kernel` those of a head's tiles, then the centre (k: ``(max + min) /
   2``; v: its mean over the tokens, the tiles' sums added by ATen), the largest
   magnitude less it and the scale (IEEE division), per channel; q's and k's one scale is the
   largest of their channels' (one ``amax``). Largest and smallest values come out the same in
   any order and the sums keep the reference's order, so these are
   :func:`sgdiff.kernels.attention_fp8.operand_scales`'s bits.
2. :func:`_quantize_heads_kernel`: a tile of tokens of one head, less its centre (k, v) in fp32,
   times the scale's IEEE inverse (one for the tensor, or per channel for v), rounded to e4m3, stored in a
   contiguous ``[B, S, H, D]`` copy (or the first ``S`` tokens of a longer one whose other tokens
   are zeros: a geometry cuDNN takes only padded).

:func:`restore_heads` turns the e4m3 output back: times v's channel scale plus its mean in fp32
(ptxas may contract the two into one fma: within the op's contract), one rounding to the output
dtype, ``[B, S, H, D]``.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgdiff.kernels.attention_fp8 import MEAN_TILE
from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX, SCALE_FLOOR, divide
from sgdiff.kernels.triton.attention_int8 import centred_tokens
from sgdiff.kernels.triton.cuda_math import to_e4m3
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait

BLOCK_S = 64  # tokens a program of the copies' passes
#: tokens a program of q's and k's statistics (any tiling gives the same range: 128 took 13.2 µs
#: for Flux's 1 x 24 x 4608 x 128 where 64 took 20.4, on an H100; ranges-probe-h100-e9bc841.json)
STATS_BLOCK = 128


@triton.jit
def _heads_offsets(bh, rows, cols, H, S, D: tl.constexpr):
    """Offsets of tokens ``rows`` of head ``bh`` in a contiguous ``[B, S, H, D]`` tensor (``S``:
    its tokens)."""
    b, h = bh // H, bh % H
    return ((b.to(tl.int64) * S + rows[:, None]) * H + h) * D + cols[None, :]


@LeanKernel
@triton.jit
def _ranges_kernel(x_ptr, part_ptr, H, S, NB, sxb, sxh, sxs, D: tl.constexpr, BLOCK: tl.constexpr):
    """Each channel's smallest and largest value over tokens ``[blk * BLOCK, (blk + 1) * BLOCK)``
    of head ``bh``: ``part[bh, blk, 0]`` and ``part[bh, blk, 1]`` (fp32, ``[B * H, NB, 2, D]``)."""
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    b, h = bh // H, bh % H
    inside = (rows < S)[:, None]
    grid_dependency_wait()
    x = tl.load(x_ptr + b.to(tl.int64) * sxb + h * sxh + rows[:, None].to(tl.int64) * sxs + cols[None, :],
                mask=inside, other=0.0).to(tl.float32)
    base = part_ptr + (bh.to(tl.int64) * NB + blk) * 2 * D + cols
    tl.store(base, tl.min(tl.where(inside, x, float("inf")), axis=0))
    tl.store(base + D, tl.max(tl.where(inside, x, float("-inf")), axis=0))


@LeanKernel
@triton.jit
def _ranges_sums_kernel(x_ptr, part_ptr, sums_ptr, H, S, NB, sxb, sxh, sxs, D: tl.constexpr, TILE: tl.constexpr):
    """:func:`_ranges_kernel`'s ranges over tokens ``[blk * TILE, (blk + 1) * TILE)`` of head
    ``bh``, and their sum in token order (:func:`sgdiff.kernels.attention_fp8.tile_sums`'s: the
    first token, plus each next one, +0 past ``S``) in ``sums[bh, blk]`` (``[B * H, NB, D]``):
    one token's channels loaded and added at a time (a tile reduced across its tokens at once
    took 79 µs for Flux's v, where its ranges alone took 20)."""
    blk, bh = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, D)
    b, h = bh // H, bh % H
    first = blk * TILE
    x_row = x_ptr + b.to(tl.int64) * sxb + h * sxh + cols
    grid_dependency_wait()
    total = tl.load(x_row + first.to(tl.int64) * sxs).to(tl.float32)  # a tile's first token is < S
    low, high = total, total
    for r in tl.static_range(1, TILE):
        inside = first + r + 0 * cols < S  # a vector mask (the interpreter takes no scalar one)
        x = tl.load(x_row + (first + r).to(tl.int64) * sxs, mask=inside, other=0.0).to(tl.float32)
        total = total + x
        low = tl.where(inside, tl.minimum(low, x), low)
        high = tl.where(inside, tl.maximum(high, x), high)
    tile = bh.to(tl.int64) * NB + blk
    tl.store(part_ptr + tile * 2 * D + cols, low)
    tl.store(part_ptr + tile * 2 * D + D + cols, high)
    tl.store(sums_ptr + tile * D + cols, total)


@LeanKernel
@triton.jit
def _finish_ranges_kernel(part_ptr, centre_ptr, scale_ptr, NB, D: tl.constexpr, DC: tl.constexpr,
                          BLOCK: tl.constexpr, CENTRE: tl.constexpr, SCALE_FLOOR_: tl.constexpr,
                          E4M3_MAX_: tl.constexpr):
    """Head ``bh``'s range per channel from its ``NB`` tiles' (:func:`_ranges_kernel`), and the
    largest magnitude less a centre: none (``CENTRE`` 0), the range's ``(max + min) / 2``, stored
    (1), or the one ``centre_ptr`` holds (2); the scale ``max(that, SCALE_FLOOR) / 448`` (IEEE
    division) per channel; channels ``[c * DC, (c + 1) * DC)`` a program (more programs, each
    looping over fewer bytes: a head of Wan's 32760 tokens has 512 tiles)."""
    bh, c = tl.program_id(0), tl.program_id(1)
    cols = c * DC + tl.arange(0, DC)
    grid_dependency_wait()
    low = tl.full((DC,), float("inf"), tl.float32)
    high = tl.full((DC,), float("-inf"), tl.float32)
    for start in range(0, NB, BLOCK):
        tiles = start + tl.arange(0, BLOCK)
        offsets = (bh.to(tl.int64) * NB + tiles)[:, None] * 2 * D + cols[None, :]
        inside = (tiles < NB)[:, None]
        low = tl.minimum(low, tl.min(tl.load(part_ptr + offsets, mask=inside, other=float("inf")), axis=0))
        high = tl.maximum(high, tl.max(tl.load(part_ptr + offsets + D, mask=inside, other=float("-inf")), axis=0))
    if CENTRE == 0:
        amax = tl.maximum(high, -low)
    else:
        if CENTRE == 1:
            centre = (high + low) * 0.5
            tl.store(centre_ptr + bh * D + cols, centre)
        else:
            centre = tl.load(centre_ptr + bh * D + cols)
        amax = tl.maximum(high - centre, centre - low)
    tl.store(scale_ptr + bh * D + cols, tl.math.div_rn(tl.maximum(amax, SCALE_FLOOR_), E4M3_MAX_))


@LeanKernel
@triton.jit
def _quantize_heads_kernel(
    x_ptr, centre_ptr, scale_ptr, out_ptr,
    H, S, SO,  # SO: the copy's tokens (S, or more: padding)
    sxb, sxh, sxs,
    D: tl.constexpr, BLOCK: tl.constexpr, PER_CHANNEL: tl.constexpr, E4M3_MAX_: tl.constexpr,
):
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    grid_dependency_wait()
    x = centred_tokens(x_ptr, centre_ptr, bh, rows, cols, H, S, sxb, sxh, sxs, D)
    if PER_CHANNEL:
        scale = tl.load(scale_ptr + bh * D + cols)[None, :]
    else:
        scale = tl.load(scale_ptr)
    y = x * tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)  # the scale's inverse: a division a channel
    y = tl.minimum(tl.maximum(y, -E4M3_MAX_), E4M3_MAX_)
    tl.store(out_ptr + _heads_offsets(bh, rows, cols, H, SO, D), to_e4m3(y), mask=(rows < S)[:, None])


@LeanKernel
@triton.jit
def _restore_heads_kernel(o8_ptr, centre_ptr, scale_ptr, out_ptr, H, S, SI, D: tl.constexpr, BLOCK: tl.constexpr):
    """``S`` tokens out of ``o8``'s ``SI`` (S, or more: padding)."""
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    offsets, inside = _heads_offsets(bh, rows, cols, H, S, D), (rows < S)[:, None]
    grid_dependency_wait()
    o = tl.load(o8_ptr + _heads_offsets(bh, rows, cols, H, SI, D), mask=inside, other=0.0).to(tl.float32)
    out = o * tl.load(scale_ptr + bh * D + cols)[None, :] + tl.load(centre_ptr + bh * D + cols)[None, :]
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=inside)


def quantize_heads(x: torch.Tensor, centre: torch.Tensor, scale: torch.Tensor,
                   tokens: Optional[int] = None) -> torch.Tensor:
    """``x`` ``[B, H, S, D]`` less ``centre`` (``[B, H, 1, D]`` fp32) over ``scale`` (0-dim, or
    ``[B, H, D]`` per channel) as e4m3, in a contiguous ``[B, tokens, H, D]`` tensor (``tokens``:
    S, or more, the others zeros)."""
    b, h, s, d = x.shape
    tokens = s if tokens is None else tokens
    out = torch.empty((b, tokens, h, d), dtype=E4M3, device=x.device)
    if tokens > s:
        out[:, s:].zero_()
    _quantize_heads_kernel[(triton.cdiv(s, BLOCK_S), b * h)](
        x, centre.reshape(b * h, d).contiguous(), scale.contiguous(), out, h, s, tokens, *x.stride()[:3], D=d,
        BLOCK=BLOCK_S, PER_CHANNEL=scale.dim() > 0, E4M3_MAX_=E4M3_MAX, num_warps=4)
    return out


def restore_heads(o8: torch.Tensor, centre: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                  tokens: Optional[int] = None) -> torch.Tensor:
    """The first ``tokens`` (default: all) of ``o8`` (contiguous ``[B, S, H, D]`` e4m3) times
    ``scale`` plus ``centre`` (both per channel of a head, ``[B, H, D]`` and ``[B, H, 1, D]``
    fp32), as ``dtype`` ``[B, tokens, H, D]``."""
    b, s_in, h, d = o8.shape
    s = s_in if tokens is None else tokens
    out = torch.empty((b, s, h, d), dtype=dtype, device=o8.device)
    _restore_heads_kernel[(triton.cdiv(s, BLOCK_S), b * h)](
        o8, centre.reshape(b * h, d).contiguous(), scale.reshape(b * h, d).contiguous(), out, h, s, s_in, D=d,
        BLOCK=BLOCK_S, num_warps=4)
    return out


def quantize_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_tokens: Optional[int] = None,
                      k_tokens: Optional[int] = None):
    """``(q8, k8, v8, q_scale, k_scale, v_mean, v_scale)``: the three e4m3 copies ``[B, S, H, D]``
    (padded with zeros to ``q_tokens`` and ``k_tokens`` where given) and what restores their
    product (:func:`sgdiff.kernels.attention_fp8.quantized_operands`'s values, in cuDNN's layout)."""
    q_zeros, q_scales = channel_ranges(q, centre="none")
    k_centre, k_scales = channel_ranges(k, centre="range")
    v_mean, v_scale = channel_ranges(v, centre="mean")
    q_scale, k_scale = q_scales.amax(), k_scales.amax()
    return (quantize_heads(q, q_zeros, q_scale, q_tokens), quantize_heads(k, k_centre, k_scale, k_tokens),
            quantize_heads(v, v_mean, v_scale, k_tokens), q_scale, k_scale, v_mean, v_scale)


FINISH_BLOCK = 64  # tiles a step of :func:`_finish_ranges_kernel`
FINISH_CHANNELS = 32  # channels a program of it


def channel_ranges(x: torch.Tensor, centre: str = "range"):
    """``(centre, scale)`` of ``x`` ``[B, H, S, D]``, ``[B, H, 1, D]`` and ``[B, H, D]`` fp32, with
    ``centre``: ``"range"``, :func:`sgdiff.kernels.attention_fp8.channel_ranges`'s values;
    ``"mean"``, :func:`sgdiff.kernels.attention_int8.channels_around`'s of
    :func:`sgdiff.kernels.attention_fp8.tiled_token_means` (the tiles' sums from the same pass,
    added by ATen); ``"none"``, zeros and each channel's ``max(largest magnitude, SCALE_FLOOR) /
    448`` (their largest is :func:`sgdiff.kernels.attention_fp8.tensor_scale`'s)."""
    b, h, s, d = x.shape
    mean = centre == "mean"
    tiles = triton.cdiv(s, MEAN_TILE if mean else STATS_BLOCK)
    part = torch.empty((b * h, tiles, 2, d), dtype=torch.float32, device=x.device)
    if mean:
        sums = torch.empty((b, h, tiles, d), dtype=torch.float32, device=x.device)
        _ranges_sums_kernel[(tiles, b * h)](x, part, sums, h, s, tiles, *x.stride()[:3], D=d, TILE=MEAN_TILE,
                                            num_warps=1)
    else:
        _ranges_kernel[(tiles, b * h)](x, part, h, s, tiles, *x.stride()[:3], D=d, BLOCK=STATS_BLOCK, num_warps=4)
    mode = {"none": 0, "range": 1, "mean": 2}[centre]
    if mode == 2:
        centre = divide(sums.sum(dim=2, keepdim=True), s)
    else:
        centre = (torch.zeros if mode == 0 else torch.empty)((b, h, 1, d), dtype=torch.float32, device=x.device)
    scale = torch.empty((b, h, d), dtype=torch.float32, device=x.device)
    channels = FINISH_CHANNELS if d % FINISH_CHANNELS == 0 else d  # head dims: multiples of 16
    _finish_ranges_kernel[(b * h, triton.cdiv(d, channels))](
        part, centre, scale, tiles, D=d, DC=channels, BLOCK=FINISH_BLOCK, CENTRE=mode, SCALE_FLOOR_=SCALE_FLOOR,
        E4M3_MAX_=E4M3_MAX, num_warps=4)
    return centre, scale
