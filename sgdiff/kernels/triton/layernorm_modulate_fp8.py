"""sgdiff::layernorm_modulate_linear_fp8 on CUDA: the LayerNorm-modulate's rows made e4m3 in the
pass that computes them, then linear_fp8's GEMM.

:func:`_layernorm_modulate_fp8_kernel` is the 4-warp LayerNorm-modulate
(:mod:`sgdiff.kernels.triton.layernorm_modulate`, one row a program, the row kept in
registers): the row's statistics, then each tile normalized and modulated as that kernel rounds
it (:func:`~sgdiff.kernels.triton.layernorm_modulate.modulated_tile`, then the output's dtype),
kept; their largest magnitude gives the row's scale and inverse, and the tiles are stored
quantized as :mod:`sgdiff.kernels.triton.linear_fp8` quantizes rows (the same IEEE divisions,
clamp and rounding). So the e4m3 rows and scales are those linear_fp8 makes of the
LayerNorm-modulate's output, which is never written in bf16 nor read back. The GEMM is
linear_fp8's over the weights' kept copies side by side (:data:`linear_fp8.WEIGHTS`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.linear_fp8 import E4M3, E4M3_MAX, SCALE_FLOOR
from sgdiff.kernels.registry import Impl
from sgdiff.kernels import dispatch, tuning
from sgdiff.kernels.triton import layernorm_channels_first, layernorm_modulate as lm, linear_fp8
from sgdiff.kernels.triton.cuda_math import INTERPRET, to_e4m3
from sgdiff.kernels.triton.launch import LeanKernel
from sgdiff.kernels.triton.rows import TL_DTYPE
from sgdiff.kernels.triton.welford import THREADS_C, VEC_C


@LeanKernel
@triton.jit
def _layernorm_modulate_fp8_kernel(
    x_ptr, w_ptr, b_ptr, scale_ptr, shift_ptr,  # as _layernorm_modulate_kernel's
    q_ptr,  # [rows, N] e4m3 rows
    qs_ptr,  # [rows] fp32: each row's scale
    S, N: tl.constexpr,
    stride_xb, stride_xs, stride_scb, stride_scs, stride_scn, stride_shb, stride_shs, stride_shn,
    eps,
    scale_add_ptr, shift_add_ptr,
    stride_sab, stride_sas, stride_san, stride_hab, stride_has, stride_han,
    ITERS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SHIFT: tl.constexpr,
    PLUS_ONE: tl.constexpr, DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr,
    HAS_SCALE_ADD: tl.constexpr, HAS_SHIFT_ADD: tl.constexpr, SCALE_FLOOR_: tl.constexpr, E4M3_MAX_: tl.constexpr,
):
    row, x_row, vecs, mean, rstd, sc_row, sh_row, adds = lm.row_start(
        x_ptr, scale_ptr, shift_ptr, scale_add_ptr, shift_add_ptr, S, N, stride_xb, stride_xs, stride_scb, stride_scs,
        stride_shb, stride_shs, stride_sab, stride_sas, stride_san, stride_hab, stride_has, stride_han, eps, ITERS,
        INTERPRET)
    t = tl.arange(0, THREADS_C)
    lane = tl.arange(0, VEC_C)
    tiles = ((), (), (), (), ())
    for k in tl.static_range(ITERS):
        col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]
        tiles = lm.load_tile(tiles, vecs, k, x_row, w_ptr, b_ptr, sc_row, sh_row, col, stride_scn, stride_shn,
                             col < N, True, HAS_WEIGHT, HAS_BIAS, True, HAS_SHIFT, adds, HAS_SCALE_ADD, HAS_SHIFT_ADD,
                             DTYPE)
    ys = ()
    amax = tl.zeros((), tl.float32)
    for k in tl.static_range(ITERS):
        col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]
        y = lm.modulated_tile(tiles, k, mean, rstd, PLUS_ONE, DTYPE).to(OUT_DTYPE).to(tl.float32)
        y = tl.where(col < N, y, 0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(y)))
        ys = ys + (y,)
    inverse = linear_fp8.row_inverse(amax, SCALE_FLOOR_, E4M3_MAX_)
    for k in tl.static_range(ITERS):
        col = (t + k * THREADS_C)[:, None] * VEC_C + lane[None, :]
        v = tl.minimum(tl.maximum(ys[k] * inverse, -E4M3_MAX_), E4M3_MAX_)
        tl.store(q_ptr + row * N + col, to_e4m3(v), mask=col < N)
    tl.store(qs_ptr + row, linear_fp8.row_scale(amax, SCALE_FLOOR_, E4M3_MAX_))


def _rows_supported(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend,
                    shift_addend) -> bool:
    """The LayerNorm-modulate's inputs as its 4-warp kernel takes them where they lie (rows with
    a unit last stride; not the channels-first ones, nor those it copies first), its output bf16."""
    return (lm.supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype,
                                scale_addend, shift_addend)
            and x.stride(-1) == 1 and not layernorm_channels_first.supported(x, scale_addend, shift_addend)
            and (out_dtype or x_dtype or x.dtype) == torch.bfloat16)


def _output_rows(x) -> torch.Tensor:
    """The LayerNorm-modulate's output as the GEMM reads it: ``[rows, N]`` bf16 (on the meta device)."""
    return torch.empty((x.numel() // x.shape[-1], x.shape[-1]), dtype=torch.bfloat16, device="meta")


def supported_layout(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend,
                     shift_addend, weights, biases) -> bool:
    return (_rows_supported(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend,
                            shift_addend)
            and linear_fp8.siblings_supported_layout(_output_rows(x), weights, biases))


def _quantizer(x, weight, bias, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend):
    """``rows(x, weight, bias, eps, scale, shift, scale_addend, shift_addend) -> (q, scales)`` for
    inputs of this geometry: the kernel bound once."""
    _, grid, ints, iters, add_ints = lm._plan(x, scale, shift, scale_addend, shift_addend)
    rows, n = grid[0], x.shape[-1]
    has_adds = (scale_addend is not None, shift_addend is not None)
    kernel = _layernorm_modulate_fp8_kernel.bind(
        grid, ITERS=iters, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, HAS_SHIFT=shift is not None,
        PLUS_ONE=scale_plus_one, DTYPE=TL_DTYPE[x_dtype or x.dtype], OUT_DTYPE=tl.bfloat16, INTERPRET=INTERPRET,
        HAS_SCALE_ADD=has_adds[0], HAS_SHIFT_ADD=has_adds[1], SCALE_FLOOR_=SCALE_FLOOR, E4M3_MAX_=E4M3_MAX,
        num_warps=4, enable_fp_fusion=False)

    def quantize(x, weight, bias, eps, scale, shift, scale_addend=None, shift_addend=None):
        q = torch.empty((rows, n), dtype=E4M3, device=x.device)
        qs = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
        kernel(x, weight if weight is not None else x, bias if bias is not None else x, scale,
               shift if shift is not None else scale, q, qs, *ints, eps,
               scale_addend if scale_addend is not None else x, shift_addend if shift_addend is not None else x,
               *add_ints)
        return q, qs

    return quantize


def layernorm_modulate_then_linears(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype,
                                    scale_addend, shift_addend, weights, biases):
    """What the graph ran before the fold, each op by its own best implementation: the
    LayerNorm-modulate, then linear_fp8_siblings of its rows (where this op's kernel does not take
    the inputs, and on GPUs without FP8 GEMMs, where linear_fp8_siblings runs bf16 GEMMs)."""
    h = dispatch.run("layernorm_modulate", x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype,
                     scale_addend, shift_addend)
    return dispatch.run("linear_fp8_siblings", h.reshape(-1, h.shape[-1]), weights, biases)


FIRST_SIGHT = tuning.FirstSight("layernorm_modulate_linear_fp8")


def bind(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend,
         weights, biases):
    """:func:`layernorm_modulate_linear_fp8` for inputs of this signature. On the GPU, chosen at
    first sight against what the graph ran before (:func:`layernorm_modulate_then_linears`), and
    kept only where faster."""
    quantize = _quantizer(x, weight, bias, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend,
                          shift_addend)

    def fused(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend,
              weights, biases):
        xq, xs = quantize(x, weight, bias, eps, scale, shift, scale_addend, shift_addend)
        return linear_fp8.gemm_of_rows_side_by_side(xq, xs, weights, biases, torch.bfloat16)

    if not x.is_cuda:
        return fused
    args = (x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend,
            weights, biases)
    key = (tuple(x.shape), x.device, tuple(tuple(w.shape) for w in weights), bool(biases), x_dtype, out_dtype)
    label, _ = FIRST_SIGHT.choose(key, (("unfused", layernorm_modulate_then_linears), ("fused", fused)), args)
    return fused if label == "fused" else layernorm_modulate_then_linears


def layernorm_modulate_linear_fp8(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend,
                                  shift_addend, weights, biases):
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    args = (x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend,
            weights, biases)
    return bind(*args)(*args)


LAYERNORM_MODULATE_LINEAR_FP8 = Impl(run=layernorm_modulate_linear_fp8, supports=supported_layout, bind=bind)
LAYERNORM_MODULATE_THEN_LINEARS = Impl(run=layernorm_modulate_then_linears)
