"""sgdiff::attention_int8 in Triton: k smoothed and quantized per block, then a FlashAttention
forward whose q k^T is an INT8 product.

1. ``k``'s mean over the tokens (per batch, head and channel) by ATen (``mean`` in fp32, the
   reference's own call: :func:`sgdiff.kernels.attention_int8.token_means`); :func:`_quantize_keys_kernel`
   subtracts it in fp32 and quantizes each block of ``K_BLOCK`` tokens of a head to int8 (IEEE
   divisions, halves away from zero), into a ``[B * H, tokens rounded up to K_BLOCK, D]`` buffer
   whose padding rows are zeros. With ``P @ v`` in e4m3, :func:`_quantize_values_kernel` does the
   same for v per channel (its scales from the mean and ATen's ``aminmax``, the reference's
   calls), into a transposed ``[B * H, D, tokens rounded up]`` buffer: the product's B operand
   K-major, as Hopper's e4m3 ``wgmma`` takes it.
2. :func:`_attention_kernel`, one program per ``Q_BLOCK`` queries of a head: quantizes its
   queries to int8 with one scale, then for each tile of ``BLOCK_N`` keys: the integer product
   (``tl.dot`` in int32: Hopper's INT8 tensor cores; exact), times the two scales and
   ``scale * log2(e)``, an online softmax in fp32 (``exp2``), P rounded to v's dtype and
   ``P @ v`` accumulated in fp32 (or ``448 P`` and v's e4m3 copy: each tile's product summed
   in fp32, the scales applied and the mean added at the end); the sum divided out at the end
   and rounded once.

A program takes ``Q_BLOCK`` (128) queries; the keys a tile, warps, stages, the precision of
``P @ v`` and the loads are chosen per signature at first sight among :data:`CONFIGS`, timed
against the unquantized fused attention, which stays where no configuration is faster (on the
H200 at 2632107, with ``P @ v`` in bf16 only: 678 µs against eager's 403 at Flux's 1 x 24 x 4608
x 128, 429 against 186 at Wan's cross-attention; the e4m3 product, which halves that product's
tensor-core time, and the TMA reads are not yet measured).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from sgdiff.kernels.attention_int8 import HEAD_DIMS, INT8_MAX, K_BLOCK, Q_BLOCK, token_means, value_channels_reference
from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX, SCALE_FLOOR
from sgdiff.kernels import sdpa, tuning
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET_C, dot_acc, to_e4m3
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.triton_compat import ensure_allocator

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


@triton.jit
def centred_tokens(x_ptr, mean_ptr, bh, rows, cols, H, S, sxb, sxh, sxs, D: tl.constexpr):
    """Tokens ``rows`` of head ``bh`` of ``x`` ``[B, H, S, D]`` in fp32 less their mean over the
    tokens (``mean_ptr``: ``[B * H, D]``), zeros past ``S``."""
    b, h = bh // H, bh % H
    inside = (rows < S)[:, None]
    x = tl.load(x_ptr + b.to(tl.int64) * sxb + h * sxh + rows[:, None].to(tl.int64) * sxs + cols[None, :],
                mask=inside, other=0.0).to(tl.float32)
    return tl.where(inside, x - tl.load(mean_ptr + bh * D + cols)[None, :], 0.0)


@LeanKernel
@triton.jit
def _quantize_keys_kernel(
    k_ptr, mean_ptr, k8_ptr, scale_ptr,
    H, S, NPAD, NKB,
    skb, skh, sks,
    D: tl.constexpr, KB: tl.constexpr, SCALE_FLOOR_: tl.constexpr, INT8_MAX_: tl.constexpr,
):
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * KB + tl.arange(0, KB), tl.arange(0, D)
    grid_dependency_wait()
    k = centred_tokens(k_ptr, mean_ptr, bh, rows, cols, H, S, skb, skh, sks, D)
    amax = tl.max(tl.max(tl.abs(k), axis=1), axis=0)
    scale = tl.math.div_rn(tl.maximum(amax, SCALE_FLOOR_), INT8_MAX_)
    k8 = _to_int8(k, scale, INT8_MAX_)
    tl.store(k8_ptr + bh.to(tl.int64) * NPAD * D + rows[:, None] * D + cols[None, :], k8)
    tl.store(scale_ptr + bh * NKB + blk, scale)


@LeanKernel
@triton.jit
def _quantize_values_kernel(
    v_ptr, mean_ptr, scale_ptr, vt_ptr,
    H, S, NPAD,
    svb, svh, svs,
    D: tl.constexpr, KB: tl.constexpr, E4M3_MAX_: tl.constexpr,
):
    """``KB`` tokens of one head: ``(v - mean) / scale`` per channel as e4m3, stored transposed
    (``vt[bh, d, token]``), zeros past the tokens."""
    blk, bh = tl.program_id(0), tl.program_id(1)
    rows, cols = blk * KB + tl.arange(0, KB), tl.arange(0, D)
    grid_dependency_wait()
    v = centred_tokens(v_ptr, mean_ptr, bh, rows, cols, H, S, svb, svh, svs, D)
    scale = tl.load(scale_ptr + bh * D + cols)
    x = tl.math.div_rn(v, tl.broadcast_to(scale[None, :], (KB, D)))
    x = tl.minimum(tl.maximum(x, -E4M3_MAX_), E4M3_MAX_)  # zeros past the tokens stay zeros
    tl.store(vt_ptr + bh.to(tl.int64) * D * NPAD + cols[None, :] * NPAD + rows[:, None], to_e4m3(x))


@triton.jit
def _fp8_product(p8, vt, acc, BLOCK_N: tl.constexpr):
    """``acc + p8 @ vt.T`` of e4m3 tiles, the tile's sum over its ``BLOCK_N`` keys added to ``acc``
    in fp32 (Hopper's e4m3 ``wgmma`` accumulates with fewer bits: promoted once a tile)."""
    if INTERPRET_C:
        return tl.dot(p8.to(tl.float32), tl.trans(vt).to(tl.float32), acc)
    else:
        return tl.dot(p8, tl.trans(vt), acc, max_num_imprecise_acc=BLOCK_N)


@triton.jit
def _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, start_n, k_src, kscale_base, v_src, svs, S_K, NPAD,
              D: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr, MASKED: tl.constexpr,
              PV_FP8: tl.constexpr, E4M3_MAX_: tl.constexpr, TMA: tl.constexpr):
    """One tile of keys folded into the online softmax: ``(m_i, l_i, acc)`` updated. ``k_src``
    and ``v_src``: base pointers, or (``TMA``) tensor descriptors."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if TMA:
        k8 = k_src.load([start_n, 0])
    else:
        k8 = tl.load(k_src + offs_n[:, None] * D + offs_d[None, :])  # zero rows past S_K (padded)
    k_scale = tl.load(kscale_base + start_n // KB)
    s = _int_scores(q8, k8) * (q_scale * k_scale * qk_scale)
    if MASKED:
        s = tl.where((offs_n < S_K)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if PV_FP8:  # v's e4m3 copy, transposed and padded with zeros: no mask
        if TMA:
            vt = v_src.load([0, start_n])
        else:
            vt = tl.load(v_src + offs_d[:, None] * NPAD + offs_n[None, :])
        acc = _fp8_product(to_e4m3(p * E4M3_MAX_), vt, acc, BLOCK_N)
    else:
        if TMA:  # rows past S_K read as zeros
            v = v_src.load([start_n, 0])
        else:
            v_ptrs = v_src + offs_n[:, None].to(tl.int64) * svs + offs_d[None, :]
            if MASKED:
                v = tl.load(v_ptrs, mask=(offs_n < S_K)[:, None], other=0.0)
            else:
                v = tl.load(v_ptrs)
        acc = dot_acc(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@LeanKernel
@triton.jit
def _attention_kernel(
    q_ptr, k8_ptr, kscale_ptr, v_ptr, vmean_ptr, vscale_ptr, o_ptr,
    qk_scale,  # scale * log2(e)
    H, S_Q, S_K, NPAD, NKB,
    sqb, sqh, sqs, svb, svh, svs, sob, soh, sos,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr,
    SCALE_FLOOR_: tl.constexpr, INT8_MAX_: tl.constexpr,
    PV_FP8: tl.constexpr,  # v_ptr: v's e4m3 copy [B * H, D, NPAD] (vmean_ptr, vscale_ptr: [B * H, D])
    E4M3_MAX_: tl.constexpr,
    TMA: tl.constexpr,  # keys and values read through tensor descriptors built here
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
    k_src = k8_ptr + bh.to(tl.int64) * NPAD * D
    kscale_base = kscale_ptr + bh * NKB
    if PV_FP8:
        v_src = v_ptr + bh.to(tl.int64) * D * NPAD
    else:
        v_src = v_ptr + b * svb + h * svh
    if TMA:
        k_src = tl.make_tensor_descriptor(k_src, shape=[NPAD, D], strides=[D, 1], block_shape=[BLOCK_N, D])
        if PV_FP8:
            v_src = tl.make_tensor_descriptor(v_src, shape=[D, NPAD], strides=[NPAD, 1], block_shape=[D, BLOCK_N])
        else:
            v_src = tl.make_tensor_descriptor(v_src, shape=[S_K, D], strides=[svs, 1], block_shape=[BLOCK_N, D])
    full = S_K - S_K % BLOCK_N  # whole tiles without a mask, then the last one masked
    for start_n in range(0, full, BLOCK_N):
        m_i, l_i, acc = _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, start_n, k_src, kscale_base, v_src, svs,
                                  S_K, NPAD, D, BLOCK_N, KB, False, PV_FP8, E4M3_MAX_, TMA)
    if full < S_K:
        m_i, l_i, acc = _key_tile(q8, q_scale, qk_scale, m_i, l_i, acc, full, k_src, kscale_base, v_src, svs,
                                  S_K, NPAD, D, BLOCK_N, KB, True, PV_FP8, E4M3_MAX_, TMA)
    out = acc / l_i[:, None]
    if PV_FP8:  # 448 P times (v - mean) / scale: back to v's units, the mean added
        v_scale = tl.load(vscale_ptr + bh * D + offs_d) / E4M3_MAX_
        out = out * v_scale[None, :] + tl.load(vmean_ptr + bh * D + offs_d)[None, :]
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
    mean = token_means(k).contiguous()
    k8 = torch.empty((b * h, nkb * K_BLOCK, d), dtype=torch.int8, device=k.device)
    scale = torch.empty((b * h, nkb), dtype=torch.float32, device=k.device)
    _quantize_keys_kernel[(nkb, b * h)](k, mean, k8, scale, h, s, nkb * K_BLOCK, nkb, *k.stride()[:3], D=d,
                                        KB=K_BLOCK, SCALE_FLOOR_=SCALE_FLOOR, INT8_MAX_=INT8_MAX,
                                        num_warps=8 if d >= 128 else 4)
    return k8, scale


def _tma_rows(v: torch.Tensor) -> bool:
    """Whether each head of ``v`` ``[B, H, S, D]`` is a 2-D ``[S, D]`` view a TMA descriptor takes:
    16-byte aligned at every batch entry and head, rows 16-byte strided."""
    size = v.element_size()
    return (v.data_ptr() % 16 == 0 and all(st * size % 16 == 0 for st in v.stride()[:3])
            and v.shape[-1] * size >= 16)


def quantize_values(v: torch.Tensor):
    """``(vt, mean, scale)``: ``v`` less its mean, per channel as e4m3, transposed ``[B * H, D,
    tokens rounded up to K_BLOCK]`` (zeros past the tokens), and the fp32 means and scales
    ``[B * H, D]`` (:func:`sgdiff.kernels.attention_int8.value_channels_reference`'s)."""
    b, h, s, d = v.shape
    nkb = triton.cdiv(s, K_BLOCK)
    mean, scale = value_channels_reference(v)
    mean, scale = mean.reshape(b * h, d).contiguous(), scale.reshape(b * h, d).contiguous()
    vt = torch.empty((b * h, d, nkb * K_BLOCK), dtype=E4M3, device=v.device)
    _quantize_values_kernel[(nkb, b * h)](v, mean, scale, vt, h, s, nkb * K_BLOCK, *v.stride()[:3], D=d, KB=K_BLOCK,
                                          E4M3_MAX_=E4M3_MAX, num_warps=8 if d >= 128 else 4)
    return vt, mean, scale


class Config(NamedTuple):
    """Keys a tile, warps, pipeline stages, whether ``P @ v`` runs in e4m3, and whether keys and
    values are read through TMA descriptors (asynchronous bulk copies, no address arithmetic in
    the loop) rather than pointer loads."""
    block_n: int
    warps: int
    stages: int
    fp8_values: bool = False
    tma: bool = False


#: what the first sight of a signature times against each other: the Triton tutorial's Hopper
#: choices around FlashAttention's (P @ v in bf16, pointer loads; on the H200 at 2632107 the best
#: took 678 µs at Flux's shape, against cuDNN's 403), then the same with ``P @ v`` in e4m3 (half
#: the bytes of v's tiles: deeper pipelines fit) and reading through TMA; all compute the same
#: blocks' scales
CONFIGS = {128: (Config(64, 8, 3), Config(128, 8, 3), Config(64, 8, 4), Config(128, 8, 2), Config(64, 4, 3),
                 Config(64, 8, 3, True), Config(128, 8, 3, True), Config(128, 8, 3, True, True),
                 Config(128, 8, 4, True, True), Config(128, 8, 3, False, True)),
           64: (Config(64, 4, 3), Config(128, 4, 3), Config(128, 8, 3), Config(64, 4, 4),
                Config(64, 4, 3, True), Config(128, 4, 3, True), Config(128, 8, 3, True, True),
                Config(128, 4, 3, False, True)),
           32: (Config(64, 4, 3), Config(128, 4, 3), Config(128, 4, 4),
                Config(64, 4, 3, True), Config(128, 4, 3, True, True))}

FIRST_SIGHT = tuning.FirstSight("attention_int8")


def _launcher(config: Config):
    def launch(q, k, v, is_causal, scale):
        b, h, s_q, d = q.shape
        s_k = k.shape[2]
        if config.tma:
            if not (config.fp8_values or _tma_rows(v)):
                raise ValueError("v's rows are not 16-byte aligned for a TMA descriptor")
            ensure_allocator()
        k8, k_scale = quantize_keys(k)
        if config.fp8_values:
            vt, v_mean, v_scale = quantize_values(v)
            values, value_strides = vt, (0, 0, 0)
        else:
            values, v_mean, v_scale, value_strides = v, k_scale, k_scale, v.stride()[:3]
        out = torch.empty((b, s_q, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)
        qk_scale = (1.0 / math.sqrt(d) if scale is None else scale) * LOG2E
        _attention_kernel[(triton.cdiv(s_q, Q_BLOCK), b * h)](
            q, k8, k_scale, values, v_mean, v_scale, out, qk_scale, h, s_q, s_k, k8.shape[1], k_scale.shape[1],
            *q.stride()[:3], *value_strides, *out.stride()[:3], D=d, BLOCK_M=Q_BLOCK, BLOCK_N=config.block_n,
            KB=K_BLOCK, SCALE_FLOOR_=SCALE_FLOOR, INT8_MAX_=INT8_MAX, PV_FP8=config.fp8_values, E4M3_MAX_=E4M3_MAX,
            TMA=config.tma, num_warps=config.warps, num_stages=config.stages)
        return out

    return launch


def choices() -> list:
    """``[(q's shape, Config or the unquantized kernel's name)]``: what first sight chose so far."""
    return FIRST_SIGHT.choices()


def bind(q, k, v, is_causal, scale):
    """The launch of the fastest for this signature, chosen at its first sight
    (:class:`sgdiff.kernels.tuning.FirstSight`) among :data:`CONFIGS`, on Hopper cuDNN's FP8
    attention (sgdiff::attention_fp8, where the cuDNN frontend is installed: the same tier's
    contract, e4m3 for q k^T, P and the output), and on the GPU the unquantized attention the tier
    below runs (torch's fastest fused kernel, :mod:`sgdiff.kernels.sdpa`), which is kept unless
    another beats it: the tier pays in fidelity only where it gains speed."""
    from sgdiff.kernels.cudnn import attention_fp8 as cudnn_fp8

    key = (tuple(q.shape), q.device, q.dtype, scale, *[(t.shape, t.stride()) for t in (q, k, v)])
    candidates = [(config, _launcher(config)) for config in CONFIGS[q.shape[-1]]]
    if q.is_cuda:
        hopper = torch.cuda.get_device_capability(q.device) >= (9, 0)
        if hopper and cudnn_fp8.supported_layout(q, k, v, is_causal, scale):
            candidates.insert(0, ("cudnn fp8", cudnn_fp8.bind(q, k, v, is_causal, scale)))
        candidates.insert(0, (f"unquantized {sdpa.choose(q, k, v, is_causal, scale)[0]}",
                              sdpa.bind(q, k, v, is_causal, scale)))
    return FIRST_SIGHT.choose(key, candidates, (q, k, v, is_causal, scale))[1]


def attention_int8(q, k, v, is_causal: bool, scale: Optional[float]):
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    return bind(q, k, v, is_causal, scale)(q, k, v, is_causal, scale)


ATTENTION_INT8 = Impl(run=attention_int8, supports=supported_layout, bind=bind)
