"""Triton sgdiff::residual_gate, bitwise equal to eager on CUDA.

Eager chain and its rounding steps::

    u = update + bias      # with update_bias: fp32 sum, rounded to promote(update, bias)
    u = u * (1 / divisor)  # with update_divisor: ATen's division by a CPU scalar (the fp64
                           # reciprocal rounded to fp32 on the host, then an fp32 product), rounded to u's dtype;
                           # not launched where that reciprocal is 1 (scales)
    g = tanh(gate)         # gate_kind "tanh": fp32 tanhf, rounded to gate.dtype
    g = sigmoid(gate)      # gate_kind "sigmoid": fp32 1 / (1 + expf(-gate)), IEEE division, rounded to gate.dtype
    y = g * update         # fp32 product, rounded to promote(gate, update)
    y = y.to(product_dtype)  # with product_dtype: eager's cast of the product
    y = residual + y       # fp32 sum, rounded to promote(residual, y)
    y = y.to(out_dtype)    # with out_dtype: Wan's .type_as(x), from the registers

sgdiff::residual_add is the same kernel with no gate: ``residual + update / divisor`` or
``residual + update * scale``, the product with an fp32 number either way (ATen's ``mul`` by a
CPU scalar takes the Python float rounded to fp32).

A program writes a tile of rows by a column block of ``residual`` ([B, S, D], contiguous),
consecutive programs in memory order; ``gate``, ``update`` and the bias are read through
broadcast strides, so ``[B, 1, D]`` gates and chunk views need no copy.
A ``tanh`` gate (rounded to gate.dtype first, as eager stores it) uses libdevice's ``tanhf``,
CUDA's own (:mod:`sgdiff.kernels.triton.cuda_math`); a ``sigmoid`` gate is ATen's CUDA
``sigmoid``, ``one / (one + std::exp(-x))`` in fp32 (``expf`` is libdevice's ``__nv_expf``, the
division correctly rounded: nvcc builds ATen without fast-math).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import dense_order, inverse_order, same_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, expf, libdevice_options, tanhf
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, TL_DTYPE, cached_plan, even_tiles, launch_rows, row_tile, rows_fit


@LeanKernel
@triton.jit
def _residual_gate_kernel(
    res_ptr,  # [B, S, D] residual, contiguous
    gate_ptr,  # gate broadcast to [B, S, D] through (stride_gb, stride_gs, stride_gd)
    upd_ptr,  # update, likewise
    bias_ptr,  # the update's bias, likewise (unused unless HAS_BIAS)
    gate_add_ptr,  # what eager added to the gate first, likewise (unused unless HAS_GATE_ADD)
    out_ptr,  # [B, S, D] contiguous output
    n_rows,  # B * S
    S: tl.constexpr,  # rows per batch entry (compiled in: divisions by it are multiplications)
    D: tl.constexpr,  # row length (compiled in)
    # the operands' strides compiled in too (a kernel per layout; a model has a few)
    stride_gb: tl.constexpr, stride_gs: tl.constexpr, stride_gd: tl.constexpr,
    stride_ub: tl.constexpr, stride_us: tl.constexpr, stride_ud: tl.constexpr,
    stride_bb: tl.constexpr, stride_bs: tl.constexpr, stride_bd: tl.constexpr,
    stride_ab: tl.constexpr, stride_as: tl.constexpr, stride_ad: tl.constexpr,
    factor,  # the update's fp32 factor: 1 / divisor or the scale, as ATen takes it on the host (unused unless SCALE)
    UPDATE_DTYPE: tl.constexpr,  # promote(update, bias)
    GATE_DTYPE: tl.constexpr,  # the gate's, or promote(gate, gate_add) with HAS_GATE_ADD
    PRODUCT_DTYPE: tl.constexpr,  # promote(gate, update + bias)
    CAST_DTYPE: tl.constexpr,  # the product's cast (PRODUCT_DTYPE where eager has none: no-op)
    SUM_DTYPE: tl.constexpr,  # promote(residual, product); out_ptr's dtype may differ (a cast)
    GATE_FN: tl.constexpr,  # GATE_FNS[gate_kind]: 0 the gate itself, 1 tanh, 2 sigmoid
    HAS_BIAS: tl.constexpr,
    HAS_GATE_ADD: tl.constexpr,
    SCALE: tl.constexpr,
    GATED: tl.constexpr,  # False: residual + update (sgdiff::residual_add; gate_ptr unused)
    BLOCK_R: tl.constexpr,  # rows a program
    BLOCK_D: tl.constexpr,  # columns a program (launch_rows, flat)
    EVEN: tl.constexpr,  # the blocks tile the rows exactly: no masks (row_tile)
    INTERPRET: tl.constexpr,
):
    r32, d, mask = row_tile(n_rows, D, BLOCK_R, BLOCK_D, True, EVEN)  # 32-bit rows: a 64-bit division is long
    row = r32.to(tl.int64)[:, None]
    bi = (r32 // S).to(tl.int64)[:, None]
    si = (r32 % S).to(tl.int64)[:, None]
    d = d[None, :]
    grid_dependency_wait()
    u = tl.load(upd_ptr + bi * stride_ub + si * stride_us + d * stride_ud, mask=mask, other=0.0)
    if HAS_BIAS:  # ATen's add after the bmm of a linear
        ub = tl.load(bias_ptr + bi * stride_bb + si * stride_bs + d * stride_bd, mask=mask, other=0.0)
        u = (u.to(tl.float32) + ub.to(tl.float32)).to(UPDATE_DTYPE)
    if SCALE:  # ATen's division by a CPU scalar (the product with its fp32 reciprocal), or its product with one
        u = (u.to(tl.float32) * factor).to(UPDATE_DTYPE)
    if GATED:
        g = tl.load(gate_ptr + bi * stride_gb + si * stride_gs + d * stride_gd, mask=mask, other=0.0)
        if HAS_GATE_ADD:  # eager's sum of the two, stored in GATE_DTYPE
            ga = tl.load(gate_add_ptr + bi * stride_ab + si * stride_as + d * stride_ad, mask=mask, other=0.0)
            g = (g.to(tl.float32) + ga.to(tl.float32)).to(GATE_DTYPE)
        if GATE_FN == 1:
            g = tanhf(g.to(tl.float32), INTERPRET).to(GATE_DTYPE)
        elif GATE_FN == 2:
            e = expf(g.to(tl.float32) * -1.0, INTERPRET)
            g = tl.math.div_rn(tl.full(e.shape, 1.0, tl.float32), 1.0 + e).to(GATE_DTYPE)
        y = (g.to(tl.float32) * u.to(tl.float32)).to(PRODUCT_DTYPE).to(CAST_DTYPE)
    else:
        y = u
    r = tl.load(res_ptr + row * D + d, mask=mask, other=0.0)
    out = r.to(tl.float32) + y.to(tl.float32)
    tl.store(out_ptr + row * D + d, out.to(SUM_DTYPE).to(out_ptr.dtype.element_ty), mask=mask)


GATE_FNS = {"plain": 0, "tanh": 1, "sigmoid": 2}


def can_use(residual, gate, update, gate_kind, residual_layout=True, update_bias=None, update_divisor=None,
            out_dtype=None, gate_addend=None, product_dtype=None) -> bool:
    return residual.is_cuda and supported_layout(residual, gate, update, gate_kind, residual_layout, update_bias,
                                                 update_divisor, out_dtype, gate_addend, product_dtype)


def supported_layout(residual, gate, update, gate_kind, residual_layout=True, update_bias=None,
                     update_divisor=None, out_dtype=None, gate_addend=None, product_dtype=None) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors).

    The residual is contiguous, where its layout and the contiguous one coincide, so
    ``residual_layout`` (which of the two the output takes) changes nothing; or, with
    ``residual_layout``, dense in another dim order (Sana's ``[B, C, S]`` token stream read as
    ``[B, S, C]``): the kernel then runs over every operand in that order (:func:`_bind`).
    """
    if not (2 <= residual.dim() <= 3 and residual.numel() > 0):
        return False
    order = [*range(residual.dim())] if residual.is_contiguous() else residual_layout and dense_order(residual)
    if not order:
        return False
    rows = residual.permute(order)
    if not rows_fit(rows, rows.shape[-1]) or rows.shape[-1] > 16384:  # rows in 32 bits (the kernel's row_tile)
        return False
    if out_dtype not in (None, *DTYPES) or gate_kind not in GATE_FNS:
        return False
    if product_dtype not in (None, *DTYPES) or (product_dtype is not None and gate is None):
        return False
    if gate_addend is not None and gate is None:
        return False
    operands = [t for t in (residual, gate, update, update_bias, gate_addend) if t is not None]
    for t in operands:
        if t.dtype not in DTYPES or t.device != residual.device or t.dim() > residual.dim():
            return False
    try:
        out_shape = torch.broadcast_shapes(*(t.shape for t in operands))
    except RuntimeError:
        return False
    return tuple(out_shape) == tuple(residual.shape)  # (promotions of DTYPES stay in DTYPES)


def residual_add_can_use(residual, update, update_divisor, update_first, update_scale=None) -> bool:
    return residual.is_cuda and residual_add_supported_layout(residual, update, update_divisor, update_first,
                                                              update_scale)


def residual_add_supported_layout(residual, update, update_divisor, update_first, update_scale=None) -> bool:
    """Both laid out alike, dense (contiguous, or Sana's transposed token stream): eager's output
    then has that layout whatever the operand order."""
    return ((update_divisor is None) != (update_scale is None) and update.shape == residual.shape
            and same_strides(residual.shape, update.stride(), residual.stride())
            and supported_layout(residual, None, update, "plain"))


def reciprocal(divisor: float) -> float:
    """``1 / divisor`` as ATen's CUDA division by a CPU scalar takes it: the Python float's fp64
    reciprocal, rounded once to fp32 (on the H200, torch 2.11; ``1f / float(divisor)`` differs,
    e.g. 999.99994 against 1000 for 1e-3). numpy gives IEEE's signed infinities for zeros."""
    with np.errstate(divide="ignore", over="ignore"):
        return float(np.float32(np.float64(1.0) / np.float64(divisor)))


def fp32(number: float) -> float:
    """A Python number as ATen's CUDA ``mul`` by a CPU scalar takes it: rounded once to fp32."""
    with np.errstate(over="ignore"):
        return float(np.float32(number))


def scales(factor: float) -> bool:
    """Whether the product with the update's fp32 factor changes an update: not where the
    factor (a divisor's reciprocal, or a scale) is 1 (diffusers' ``/ rescale_output_factor`` of
    1.0, ConsisID's default face scale), since ``u * 1.0`` rounds to ``u`` for every number, and
    a NaN update stays NaN through the gate's product and the sum."""
    return factor != 1.0


# Warps a program, each thread one 16-byte vector of the residual: 8, and 16 from Wan's sizes on
# (against 1024 elements and 4 warps a program: bench/results/README.md).
WARPS, WARPS_LARGE, LARGE = 8, 16, 1 << 25


@cached_plan
def _plan(residual, gate, update, update_bias, gate_addend=None, product_dtype=None):
    shape = (1, *residual.shape) if residual.dim() == 2 else tuple(residual.shape)
    B, S, D = shape

    def strides(t):
        return t.expand(shape).stride() if t is not None else (0, 0, 0)

    updated = torch.promote_types(update.dtype, update_bias.dtype) if update_bias is not None else update.dtype
    gated = None if gate is None else gate.dtype if gate_addend is None else torch.promote_types(gate.dtype,
                                                                                              gate_addend.dtype)
    product = torch.promote_types(gated, updated) if gate is not None else updated
    added = product_dtype or product  # what the sum reads: the product, or eager's cast of it
    ints = (B * S, S, D, *strides(gate), *strides(update), *strides(update_bias), *strides(gate_addend))
    warps = WARPS_LARGE if residual.numel() >= LARGE else WARPS
    vector = 16 // residual.element_size()  # elements a thread: 8 bf16 or 4 fp32
    grid, block_r, block_d = launch_rows(B * S, D, max_block=warps * 32 * vector, flat=True)
    return grid, ints, updated, gated, product, added, torch.promote_types(residual.dtype, added), \
        dict(BLOCK_R=block_r, BLOCK_D=block_d, EVEN=even_tiles(B * S, D, block_r, block_d),
             num_warps=max(1, min(warps, block_r * block_d // (32 * vector))))  # a small residual: fewer


def _bind_rows(residual, gate, update, gate_kind, update_bias, update_divisor, out_dtype=None, gate_addend=None,
               update_scale=None, product_dtype=None):
    """The launch for inputs of this signature, the residual contiguous: ``launch(residual, gate,
    update, bias, gate_addend)``."""
    grid, ints, updated, gated, product, added, total, blocks = _plan(residual, gate, update, update_bias,
                                                                      gate_addend, product_dtype)
    dtype, view = out_dtype or total, residual.shape
    inv = (reciprocal(update_divisor) if update_divisor is not None
           else fp32(update_scale) if update_scale is not None else 1.0)
    kernel = _residual_gate_kernel.bind(
        grid, UPDATE_DTYPE=TL_DTYPE[updated], PRODUCT_DTYPE=TL_DTYPE[product], CAST_DTYPE=TL_DTYPE[added],
        SUM_DTYPE=TL_DTYPE[total],
        GATE_DTYPE=TL_DTYPE[gated] if gated is not None else TL_DTYPE[updated],
        GATE_FN=GATE_FNS[gate_kind], HAS_BIAS=update_bias is not None, HAS_GATE_ADD=gate_addend is not None,
        SCALE=scales(inv),
        GATED=gate is not None, **blocks, INTERPRET=INTERPRET,
        enable_fp_fusion=False, **libdevice_options())

    def launch(residual, gate, update, bias, gate_addend=None):
        out = torch.empty(view, dtype=dtype, device=residual.device)  # the kernel takes pointers: no view
        kernel(residual, gate if gate is not None else update, update, bias if bias is not None else update,
               gate_addend if gate_addend is not None else update, out, *ints, inv)
        return out

    return launch


def _bind(residual, gate, update, gate_kind, update_bias, update_divisor, out_dtype=None, gate_addend=None,
          update_scale=None, product_dtype=None):
    """:func:`_bind_rows` for a residual of any dense layout: every operand broadcast to the
    residual's shape and permuted so that the residual is contiguous (:func:`dense_order`), the
    output permuted back (the residual's strides). Elementwise: the same bits in any order."""
    def bind_rows(residual, gate, update, update_bias, gate_addend):
        return _bind_rows(residual, gate, update, gate_kind, update_bias, update_divisor, out_dtype, gate_addend,
                          update_scale, product_dtype)

    if residual.is_contiguous():
        return bind_rows(residual, gate, update, update_bias, gate_addend)
    order, shape = dense_order(residual), residual.shape
    inverse = inverse_order(order)

    def rows(t):
        return None if t is None else t.expand(shape).permute(order)

    launch = bind_rows(rows(residual), rows(gate), rows(update), rows(update_bias), rows(gate_addend))
    return lambda residual, gate, update, bias, gate_addend=None: launch(
        rows(residual), rows(gate), rows(update), rows(bias), rows(gate_addend)).permute(inverse)


def bind(residual, gate, update, gate_kind, residual_layout=True, update_bias=None, update_divisor=None,
         out_dtype=None, gate_addend=None, product_dtype=None):
    """:func:`residual_gate` for inputs of this signature, its host arithmetic done."""
    launch = _bind(residual, gate, update, gate_kind, update_bias, update_divisor, out_dtype, gate_addend,
                   product_dtype=product_dtype)

    def bound(residual, gate, update, gate_kind, residual_layout=True, update_bias=None, _d=None, _o=None,
              gate_addend=None, _p=None):
        return launch(residual, gate, update, update_bias, gate_addend)

    return bound


def residual_gate(residual, gate, update, gate_kind, residual_layout=True, update_bias=None, update_divisor=None,
                  out_dtype=None, gate_addend=None, product_dtype=None):
    """Launch; the caller has checked :func:`can_use`."""
    return _bind(residual, gate, update, gate_kind, update_bias, update_divisor, out_dtype, gate_addend,
                 product_dtype=product_dtype)(residual, gate, update, update_bias, gate_addend)


def residual_add_bind(residual, update, update_divisor, update_first, update_scale=None):
    launch = _bind(residual, None, update, "plain", None, update_divisor, update_scale=update_scale)
    return lambda residual, update, *_: launch(residual, None, update, None)


def residual_add(residual, update, update_divisor, update_first, update_scale=None):
    """Launch; the caller has checked :func:`residual_add_can_use`."""
    return residual_add_bind(residual, update, update_divisor, update_first, update_scale)(residual, update)


RESIDUAL_GATE = Impl(run=residual_gate, supports=supported_layout, bind=bind)
RESIDUAL_ADD = Impl(run=residual_add, supports=residual_add_supported_layout, bind=residual_add_bind)
