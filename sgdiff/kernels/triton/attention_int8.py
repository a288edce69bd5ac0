"""sgdiff::attention_int8 in Triton: k smoothed and quantized per block, then a FlashAttention
forward whose q k^T is an INT8 product.

1. ``k``'s mean over the tokens (per batch, head and channel) by ATen (``mean`` in fp32, the
   reference's own call: :func:`sgdiff.kernels.attention_int8.key_means`); :func:`_quantize_keys_kernel` subtracts it in fp32 and quantizes
   each block of ``K_BLOCK`` tokens of a head to int8 (IEEE divisions, halves away from zero),
   into a ``[B * H, tokens rounded up to K_BLOCK, D]`` buffer whose padding rows are zeros.
2. :func:`_attention_kernel`, one program per ``Q_BLOCK`` queries of a head: quantizes its
   queries to int8 with one scale, then for each tile of ``BLOCK_N`` keys: the integer product
   (``tl.dot`` in int32: Hopper's INT8 tensor cores; exact), times the two scales and
   ``scale * log2(e)``, an online softmax in fp32 (``exp2``), P rounded to v's dtype and
   ``P @ v`` accumulated in fp32; the sum divided out at the end and rounded once.

A program takes ``Q_BLOCK`` (128) queries; the keys a tile, warps and stages are chosen per
signature at first sight among :data:`CONFIGS`, timed against the unquantized fused attention,
which stays where no configuration is faster (on the H200 at 2632107: 678 µs against eager's
403 at Flux's 1 x 24 x 4608 x 128, 429 against 186 at Wan's cross-attention).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from sgdiff.kernels.attention_int8 import HEAD_DIMS, INT8_MAX, K_BLOCK, Q_BLOCK, key_means
from sgdiff.kernels.linear_fp8 import SCALE_FLOOR
from sgdiff.kernels import sdpa, tuning
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET_C, dot_acc
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait

LOG2E = 1.4426950408889634


@triton.jit
def _to_int8(x, scale, INT8_MAX_: tl.constexpr):
    """``x / scale`` (IEEE) rounded half away from zero, clamped to ±127, as int8."""
    v = tl.math.div_rn(x, scale)
    v = tl.where(v >= 0, tl.floor(v + 0.5), tl.ceil(v - 0.5))
    return tl.minimum(tl.maximum(v, -INT8_MAX_), INT8_MAX_).to(tl.int8)


@triton.jit
def _int_scores(q8, k8):
    """``q8 @ k8.T`` of int8 tiles, exact, as fp32 (int32 on the tensor cores; under the
    interpreter in fp32, also exact: every sum is an integer below 2^24)."""
    if INTERPRET_C:
        return tl.dot(q8.to(tl.float32), tl.trans(k8).to(tl.float32))
    else:
        return tl.dot(q8, tl.trans(k8)).to(tl.float32)


@LeanKernel
@triton.jit
def _quantize_keys_kernel(
    k_ptr, mean_ptr, k8_ptr, scale_ptr,
    H, S, NPAD, NKB,
    skb, skh, sks,
    D: tl.constexpr, KB: tl.constexpr, SCALE_FLOOR_: tl.constexpr, INT8_MAX_: tl.constexpr,
):
    blk, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = blk * KB + tl.arange(0, KB)
    cols = tl.arange(0, D)
    inside = (rows < S)[:, None]
    grid_dependency_wait()
    k = tl.load(k_ptr + b.to(tl.int64) * skb + h * skh + rows[:, None].to(tl.int64) * sks + cols[None, :],
                mask=inside, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + bh * D + cols)
    k = tl.where(inside, k - mean[None, :], 0.0)
    amax = tl.max(tl.max(tl.abs(k), axis=1), axis=0)
    scale = tl.math.div_rn(tl.maximum(amax, SCALE_FLOOR_), INT8_MAX_)
    k8 = _to_int8(k, scale, INT8_MAX_)
    tl.store(k8_ptr + bh.to(tl.int64) * NPAD * D + rows[:, None] * D + cols[None, :], k8)
    tl.store(scale_ptr + bh * NKB + blk, scale)


@triton.jit
def _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, start_n, k_base, kscale_base, v_base, svs, S_K,
              D: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr, MASKED: tl.constexpr):
    """One tile of keys folded into the online softmax: ``(m_i, l_i, acc)`` updated."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k8 = tl.load(k_base + offs_n[:, None] * D + offs_d[None, :])  # zero rows past S_K (padded)
    k_scale = tl.load(kscale_base + start_n // KB)
    s = _int_scores(q8, k8) * (q_scale * k_scale * qk_scale)
    if MASKED:
        s = tl.where((offs_n < S_K)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    v_ptrs = v_base + offs_n[:, None].to(tl.int64) * svs + offs_d[None, :]
    if MASKED:
        v = tl.load(v_ptrs, mask=(offs_n < S_K)[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = dot_acc(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@LeanKernel
@triton.jit
def _attention_kernel(
    q_ptr, k8_ptr, kscale_ptr, v_ptr, o_ptr,
    qk_scale,  # scale * log2(e)
    H, S_Q, S_K, NPAD, NKB,
    sqb, sqh, sqs, svb, svh, svs, sob, soh, sos,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr,
    SCALE_FLOOR_: tl.constexpr, INT8_MAX_: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows_q = offs_m < S_Q
    grid_dependency_wait()
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None].to(tl.int64) * sqs + offs_d[None, :],
                mask=rows_q[:, None], other=0.0).to(tl.float32)
    q_scale = tl.math.div_rn(tl.maximum(tl.max(tl.max(tl.abs(q), axis=1), axis=0), SCALE_FLOOR_), INT8_MAX_)
    q8 = _to_int8(q, q_scale, INT8_MAX_)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    k_base = k8_ptr + bh.to(tl.int64) * NPAD * D
    kscale_base = kscale_ptr + bh * NKB
    v_base = v_ptr + b * svb + h * svh
    full = S_K - S_K % BLOCK_N  # whole tiles without a mask, then the last one masked
    for start_n in range(0, full, BLOCK_N):
        m_i, l_i, acc = _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, start_n, k_base, kscale_base, v_base, svs,
                                  S_K, D, BLOCK_N, KB, False)
    if full < S_K:
        m_i, l_i, acc = _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, full, k_base, kscale_base, v_base, svs,
                                  S_K, D, BLOCK_N, KB, True)
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None].to(tl.int64) * sos + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rows_q[:, None])


def supported_layout(q, k, v, is_causal, scale) -> bool:
    """Non-causal attention of 16-bit ``[B, H, S, D]`` q, k, v of one dtype and head dim (32, 64
    or 128), each with unit stride along D, k and v of one token count."""
    return (not is_causal and q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] in HEAD_DIMS
            and k.shape[-1] == v.shape[-1] == q.shape[-1] and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and k.shape[2] == v.shape[2] and q.shape[2] > 0 and k.shape[2] > 0
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1)


def quantize_keys(k: torch.Tensor):
    """``(k8, scale)``: smoothed ``k`` as int8 ``[B * H, tokens rounded up to K_BLOCK, D]`` (zeros
    past the tokens) and fp32 scales ``[B * H, blocks]``."""
    b, h, s, d = k.shape
    nkb = triton.cdiv(s, K_BLOCK)
    mean = key_means(k).contiguous()
    k8 = torch.empty((b * h, nkb * K_BLOCK, d), dtype=torch.int8, device=k.device)
    scale = torch.empty((b * h, nkb), dtype=torch.float32, device=k.device)
    _quantize_keys_kernel[(nkb, b * h)](k, mean, k8, scale, h, s, nkb * K_BLOCK, nkb, *k.stride()[:3], D=d,
                                        KB=K_BLOCK, SCALE_FLOOR_=SCALE_FLOOR, INT8_MAX_=INT8_MAX,
                                        num_warps=8 if d >= 128 else 4)
    return k8, scale


#: (keys a tile, warps, stages) the first sight of a signature times against each other: the
#: Triton tutorial's Hopper choices around FlashAttention's; all compute the same blocks' scales
CONFIGS = {128: ((64, 8, 3), (128, 8, 3), (64, 8, 4), (128, 8, 2), (64, 4, 3)),
           64: ((64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 4)),
           32: ((64, 4, 3), (128, 4, 3), (128, 4, 4))}

FIRST_SIGHT = tuning.FirstSight("attention_int8")


def _launcher(config):
    block_n, warps, stages = config

    def launch(q, k, v, is_causal, scale):
        b, h, s_q, d = q.shape
        s_k = k.shape[2]
        k8, k_scale = quantize_keys(k)
        out = torch.empty((b, s_q, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)
        qk_scale = (1.0 / math.sqrt(d) if scale is None else scale) * LOG2E
        _attention_kernel[(triton.cdiv(s_q, Q_BLOCK), b * h)](
            q, k8, k_scale, v, out, qk_scale, h, s_q, s_k, k8.shape[1], k_scale.shape[1],
            *q.stride()[:3], *v.stride()[:3], *out.stride()[:3], D=d, BLOCK_M=Q_BLOCK, BLOCK_N=block_n, KB=K_BLOCK,
            SCALE_FLOOR_=SCALE_FLOOR, INT8_MAX_=INT8_MAX, num_warps=warps,
            num_stages=stages)
        return out

    return launch


def choices() -> list:
    """``[(q's shape, (keys a tile, warps, stages))]``: what first sight chose so far."""
    return FIRST_SIGHT.choices()


def bind(q, k, v, is_causal, scale):
    """The launch of the fastest for this signature, chosen at its first sight
    (:class:`sgdiff.kernels.tuning.FirstSight`) among :data:`CONFIGS` and, on the GPU, the
    unquantized attention the tier below runs (torch's fastest fused kernel, :mod:`sgdiff.kernels.sdpa`),
    which is kept unless a configuration beats it: the tier pays in fidelity only where it gains speed."""
    key = (tuple(q.shape), q.device, q.dtype, scale, *[(t.shape, t.stride()) for t in (q, k, v)])
    candidates = [(config, _launcher(config)) for config in CONFIGS[q.shape[-1]]]
    if q.is_cuda:
        candidates.insert(0, (f"unquantized {sdpa.choose(q, k, v, is_causal, scale)[0]}",
                              sdpa.bind(q, k, v, is_causal, scale)))
    return FIRST_SIGHT.choose(key, candidates, (q, k, v, is_causal, scale))[1]


def attention_int8(q, k, v, is_causal: bool, scale: Optional[float]):
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    return bind(q, k, v, is_causal, scale)(q, k, v, is_causal, scale)


ATTENTION_INT8 = Impl(run=attention_int8, supports=supported_layout, bind=bind)
