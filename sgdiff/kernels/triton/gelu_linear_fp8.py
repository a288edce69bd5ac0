"""sgdiff::gelu_linear_fp8 on CUDA: the GEMM's rows made in one pass from the chain before it,
then linear_fp8's GEMM.

One program holds ``ROWS`` whole rows of the GEMM's input ``[head | gelu(x)]``: it reads ``x``
(and ``head``), computes the GELU-tanh as ``x * rcp(1 + ex2(t))``
(:func:`sgdiff.kernels.gelu_linear_fp8.gelu_tanh_fast`; ATen's form, with CUDA's ``tanhf``, made
the pass bound by its arithmetic: 84 µs for Flux's 4096 x 12288 rows on an H100, this one 58, its
bytes about 51) rounded to ``x``'s dtype, takes each row's largest magnitude over
both parts, and writes the row's e4m3 values and fp32 scale exactly as linear_fp8's quantization
does (:func:`sgdiff.kernels.triton.linear_fp8.row_inverse`, ``store_row_part``), each part held as
two power-of-two tiles (``row_parts``). Neither the GELU's output nor the cat is ever written.
The GEMM is linear_fp8's (``torch._scaled_mm`` with row-wise scales over the weight's kept e4m3
copy).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgdiff.kernels import tuning
from sgdiff.kernels.gelu_linear_fp8 import KAPPA, NEG_2_LOG2E_BETA, gelu_input
from sgdiff.kernels.linear_fp8 import DTYPES, E4M3, E4M3_MAX, MAX_K, SCALE_FLOOR
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import linear_fp8
from sgdiff.kernels.triton.cuda_math import INTERPRET, fast_sigmoid_scale
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import cached_plan, row_offsets, rows_fit, shape4, strides4


#: warps a program of the GELU pass takes at most: at Flux's and Wan's rows (12288, 3072 + 12288,
#: 8960 values) 8 warps took 86, 116 and 418 µs on an H100 where 16 took 89, 121 and 544
#: (bench/results/runs/gelu-rows-probe-h100-93933d2.json)
MAX_WARPS = 8


@LeanKernel
@triton.jit
def _gelu_rows_fp8_kernel(
    x_ptr, head_ptr, q_ptr, scale_ptr,
    n_rows, n1, n2, DH, DX,
    sx0, sx1, sx2, sx3,
    sh0, sh1, sh2, sh3,
    ROWS: tl.constexpr,
    X_MAIN: tl.constexpr,
    X_TAIL: tl.constexpr,
    H_MAIN: tl.constexpr,
    H_TAIL: tl.constexpr,
    HAS_HEAD: tl.constexpr,
    SCALE_FLOOR_: tl.constexpr,
    E4M3_MAX_: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    q_rows = q_ptr + rows.to(tl.int64) * (DH + DX)
    x_rows = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)
    grid_dependency_wait()
    x_main = _gelu(linear_fp8.load_row_part(x_rows, sx3, row_ok, 0, DX, X_MAIN), INTERPRET)
    x_tail = _gelu(linear_fp8.load_row_part(x_rows, sx3, row_ok, X_MAIN, DX, X_TAIL), INTERPRET)
    amax = linear_fp8.row_largest(x_main, x_tail)
    if HAS_HEAD:
        h_rows = head_ptr + row_offsets(rows, n1, n2, sh0, sh1, sh2)
        h_main = linear_fp8.load_row_part(h_rows, sh3, row_ok, 0, DH, H_MAIN)
        h_tail = linear_fp8.load_row_part(h_rows, sh3, row_ok, H_MAIN, DH, H_TAIL)
        amax = tl.maximum(amax, linear_fp8.row_largest(h_main, h_tail))
    inverse = linear_fp8.row_inverse(amax, SCALE_FLOOR_, E4M3_MAX_)
    if HAS_HEAD:
        linear_fp8.store_row_part(q_rows, row_ok, 0, DH, h_main, inverse, H_MAIN, E4M3_MAX_)
        linear_fp8.store_row_part(q_rows, row_ok, H_MAIN, DH, h_tail, inverse, H_TAIL, E4M3_MAX_)
    linear_fp8.store_row_part(q_rows + DH, row_ok, 0, DX, x_main, inverse, X_MAIN, E4M3_MAX_)
    linear_fp8.store_row_part(q_rows + DH, row_ok, X_MAIN, DX, x_tail, inverse, X_TAIL, E4M3_MAX_)
    tl.store(scale_ptr + rows, linear_fp8.row_scale(amax, SCALE_FLOOR_, E4M3_MAX_), mask=row_ok)


C_: tl.constexpr = tl.constexpr(NEG_2_LOG2E_BETA)
KAPPA_: tl.constexpr = tl.constexpr(KAPPA)


@triton.jit
def _gelu(x, INTERPRET: tl.constexpr):
    """The GELU-tanh of a loaded tile (:func:`sgdiff.kernels.gelu_linear_fp8.gelu_tanh_fast`),
    rounded to its dtype and held so: half the registers of fp32, so that more rows are in
    flight; every use widens it exactly."""
    xf = x.to(tl.float32)
    t = C_ * tl.fma(tl.full(xf.shape, KAPPA_, tl.float32), (xf * xf) * xf, xf)
    return fast_sigmoid_scale(xf, t, INTERPRET).to(x.dtype)


def supported_layout(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     head: Optional[torch.Tensor] = None) -> bool:
    """A bf16 ``x`` of 1 to 4 dims (any strides) and ``head`` of its leading dims and dtype; the
    GEMM's K (``head``'s last dim plus ``x``'s) and the weight's N as linear_fp8 takes them."""
    k = x.shape[-1] + (head.shape[-1] if head is not None else 0)
    return (x.dtype in DTYPES and 1 <= x.dim() <= 4 and x.numel() > 0 and rows_fit(x, x.shape[-1])
            and (head is None or (head.dtype == x.dtype and head.device == x.device and head.dim() == x.dim()
                                  and head.shape[:-1] == x.shape[:-1] and head.shape[-1] > 0))
            and weight.dim() == 2 and weight.dtype == x.dtype and weight.shape[1] == k and weight.stride(1) == 1
            and k % linear_fp8.ALIGN == 0 and weight.shape[0] % linear_fp8.ALIGN == 0 and k <= MAX_K
            and (bias is None or (bias.dim() == 1 and bias.dtype == x.dtype and bias.shape[0] == weight.shape[0])))


@cached_plan
def _plan(x, head):
    lead = x.shape[:-1]
    dx, dh = x.shape[-1], (head.shape[-1] if head is not None else 0)
    shape = shape4((*lead, 1))
    n_rows = shape[0] * shape[1] * shape[2]
    (x_main, x_tail), (h_main, h_tail) = linear_fp8.row_parts(dx), (linear_fp8.row_parts(dh) if dh else (16, 16))
    rows, warps = linear_fp8.rows_and_warps(dh + dx)
    warps = min(warps, MAX_WARPS)
    ints = (n_rows, shape[1], shape[2], dh, dx, *strides4(x, x.shape),
            *(strides4(head, head.shape) if head is not None else (0, 0, 0, 0)))
    return n_rows, dh + dx, triton.cdiv(n_rows, rows), ints, dict(
        ROWS=rows, X_MAIN=x_main, X_TAIL=x_tail, H_MAIN=h_main, H_TAIL=h_tail, HAS_HEAD=head is not None,
        num_warps=warps)


def _quantizer(x: torch.Tensor, head: Optional[torch.Tensor]):
    """``quantize(x, head)``: the e4m3 rows ``[M, K]`` of ``[head | gelu(x)]`` and their fp32
    scales ``[M, 1]``, the launch bound to this geometry."""
    n_rows, k, grid, ints, meta = _plan(x, head)
    kernel = _gelu_rows_fp8_kernel.bind((grid,), **meta, SCALE_FLOOR_=SCALE_FLOOR, E4M3_MAX_=E4M3_MAX,
                                         INTERPRET=INTERPRET, enable_fp_fusion=False)

    def quantize(x, head=None):
        q = torch.empty((n_rows, k), dtype=E4M3, device=x.device)
        scale = torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
        kernel(x, head if head is not None else x, q, scale, *ints)
        return q, scale

    return quantize


def gelu_rows_fp8(x: torch.Tensor, head: Optional[torch.Tensor] = None):
    """``(q, scale)``: the rows of ``cat([head, gelu(x, "tanh")], -1)`` (or of ``gelu(x)``)
    quantized as :func:`sgdiff.kernels.linear_fp8.quantize_rows_reference` quantizes them."""
    return _quantizer(x, head)(x, head)


def _bf16_chain(x, weight, bias, head=None):
    """The unquantized chain: GELU, cat, cuBLAS's GEMM (``[M, N]``)."""
    return linear_fp8.linear_bf16(gelu_input(x, head), weight, bias)


FIRST_SIGHT = tuning.FirstSight("gelu_linear_fp8")


def bind(x, weight, bias, head=None):
    """:func:`gelu_linear_fp8` for inputs of this signature. On the GPU, chosen at the
    signature's first sight against the unquantized chain (:func:`_bf16_chain`), kept only where
    faster, as linear_fp8 is."""
    quantize = _quantizer(x, head)

    def launch(x, weight, bias, head=None):
        return linear_fp8.gemm_of_rows(*quantize(x, head), weight, bias, x.dtype)

    if not x.is_cuda:
        return launch
    key = (tuple(x.shape), x.device, tuple(weight.shape), bias is not None,
           tuple(head.shape) if head is not None else None)
    label, _ = FIRST_SIGHT.choose(key, (("bf16", _bf16_chain), ("fp8", launch)), (x, weight, bias, head))
    return launch if label == "fp8" else _bf16_chain


def gelu_linear_fp8(x, weight, bias, head=None):
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    return bind(x, weight, bias, head)(x, weight, bias, head)


GELU_LINEAR_FP8 = Impl(run=gelu_linear_fp8, supports=supported_layout, bind=bind)
GELU_LINEAR_BF16 = Impl(run=_bf16_chain)
