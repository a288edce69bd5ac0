"""Triton sgdiff::gelu_tanh_cat, bitwise equal to eager on CUDA.

ATen's GELU-tanh (aten/src/ATen/native/cuda/ActivationGeluKernel.cu), as nvcc compiles it
(``kKappa * x_cube`` contracted into the add)::

    x3    = (x * x) * x
    inner = kBeta * fma(kKappa, x3, x)          # kBeta = sqrt(2 / pi), kKappa = 0.044715
    g     = (0.5 * x) * (1 + tanhf(inner))      # rounded to x.dtype

Checked on an H200 against ``F.gelu(x, approximate="tanh")`` for every fp16 and bf16 value
and 2^26 random fp32 values (the form without the FMA differs on fp32 inputs).

The output ``[..., Dh + Dx]`` is contiguous; a program covers ``BLOCK_R`` rows and one block
of ``BLOCK_D`` columns, each column copied from ``head`` or computed from ``x`` (a block that
holds only one kind does only that work). :func:`bind_head` launches the head's blocks alone, a
copy into a cat whose other columns another kernel writes (sgdiff::linear_act_cat's GEMM).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from sgdiff.kernels.registry import Impl

from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options, tanhf
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan, launch_rows, row_offsets, rows_fit, shape4, strides4

K_BETA = tl.constexpr(0.7978845608028654)  # M_SQRT2 * M_2_SQRTPI * 0.5, rounded to fp32 in the kernel
K_KAPPA = tl.constexpr(0.044715)


@triton.jit
def gelu_tanh(x, INTERPRET: tl.constexpr):
    """ATen's CUDA GELU-tanh of an fp32 tile (see the module doc)."""
    x3 = (x * x) * x
    inner = K_BETA * tl.fma(tl.full(x.shape, K_KAPPA, tl.float32), x3, x)
    return (0.5 * x) * (1.0 + tanhf(inner, INTERPRET))


@LeanKernel
@triton.jit
def _gelu_tanh_cat_kernel(
    head_ptr, x_ptr, out_ptr,
    n_rows, n1, n2, DH, DX,
    sh0, sh1, sh2, sh3,
    sx0, sx1, sx2, sx3,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    first = tl.program_id(1) * BLOCK_D
    cols = first + tl.arange(0, BLOCK_D)
    row_ok = (rows < n_rows)[:, None]
    o = out_ptr + rows[:, None] * (DH + DX) + cols[None, :]
    h_row = head_ptr + row_offsets(rows, n1, n2, sh0, sh1, sh2)[:, None]
    x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    grid_dependency_wait()
    if first + BLOCK_D <= DH:  # a block of head columns only: a copy
        tl.store(o, tl.load(h_row + cols[None, :] * sh3, mask=row_ok), mask=row_ok)
    elif first >= DH:  # GELU columns only (names apart from the next branch's: Triton types them per scope)
        x_ok = row_ok & (cols < DH + DX)[None, :]
        xs = tl.load(x_row + (cols - DH)[None, :] * sx3, mask=x_ok, other=0.0).to(tl.float32)
        tl.store(o, gelu_tanh(xs, INTERPRET).to(out_ptr.dtype.element_ty), mask=x_ok)
    else:  # the block where head ends
        in_head = (cols < DH)[None, :]
        in_x = ((cols >= DH) & (cols < DH + DX))[None, :]
        h = tl.load(h_row + cols[None, :] * sh3, mask=row_ok & in_head, other=0.0)
        x = tl.load(x_row + (cols - DH)[None, :] * sx3, mask=row_ok & in_x, other=0.0).to(tl.float32)
        g = gelu_tanh(x, INTERPRET).to(out_ptr.dtype.element_ty)
        tl.store(o, tl.where(in_head, h, g), mask=row_ok & (in_head | in_x))


def supported_layout(head, x) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    return (x.dtype in DTYPES and head.dtype == x.dtype and head.device == x.device
            and 1 <= x.dim() <= 4 and head.dim() == x.dim() and x.numel() > 0 and rows_fit(x, x.shape[-1])
            and head.shape[:-1] == x.shape[:-1])


def can_use(head, x) -> bool:
    return x.is_cuda and supported_layout(head, x)


def _geometry(head, x):
    """The kernel's rows (x's leading dims), both widths and its integer arguments."""
    shape = shape4((*x.shape[:-1], 1))
    n_rows = shape[0] * shape[1] * shape[2]
    dh, dx = head.shape[-1], x.shape[-1]
    return n_rows, dh, dx, (n_rows, shape[1], shape[2], dh, dx, *strides4(head, head.shape), *strides4(x, x.shape))


@cached_plan
def _plan(head, x):
    n_rows, dh, dx, ints = _geometry(head, x)
    grid, block_r, block_d = launch_rows(n_rows, dh + dx, max_block=1024)  # measured: 16 elements per thread (2 warps)
    return (*x.shape[:-1], dh + dx), grid, ints, dict(BLOCK_R=block_r, BLOCK_D=block_d)


def bind(head, x):
    """:func:`gelu_tanh_cat` for inputs of this signature, its host arithmetic done."""
    out_shape, grid, ints, blocks = _plan(head, x)
    kernel = _gelu_tanh_cat_kernel.bind(grid, **blocks, INTERPRET=INTERPRET, num_warps=2, enable_fp_fusion=False,
                                         **libdevice_options())

    def launch(head, x):
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        kernel(head, x, out, *ints)
        return out

    return launch


@cached_plan
def _head_plan(head, x):
    n_rows, dh, dx, ints = _geometry(head, x)
    block_d = min(1024, dh & -dh)  # the widest power of two dividing Dh: no block reaches x's columns
    block_r = max(1, min(triton.next_power_of_2(n_rows), 1024 // block_d))
    grid = (triton.cdiv(n_rows, block_r), dh // block_d)
    return grid, ints, dict(BLOCK_R=block_r, BLOCK_D=block_d)


def bind_head(head, x):
    """``launch(head, x, out)``: ``head`` copied into the first ``Dh`` columns of ``out``, the
    contiguous ``[..., Dh + Dx]`` cat of :func:`gelu_tanh_cat`, its last ``Dx`` columns left as
    they are; ``x`` (``[..., Dx]``, any strides; only its shape is read) gives their width. The
    kernel's grid holds the head's column blocks alone. Takes what :func:`supported_layout`
    takes."""
    grid, ints, blocks = _head_plan(head, x)
    kernel = _gelu_tanh_cat_kernel.bind(grid, **blocks, INTERPRET=INTERPRET, num_warps=2, enable_fp_fusion=False,
                                         **libdevice_options())

    def launch(head, x, out):
        kernel(head, x, out, *ints)

    return launch


def gelu_tanh_cat(head, x):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(head, x)(head, x)


GELU_TANH_CAT = Impl(run=gelu_tanh_cat, supports=supported_layout, bind=bind)
