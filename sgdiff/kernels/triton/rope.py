"""Triton sgdiff::rope and sgdiff::rope_even_odd, bitwise equal to eager on CUDA.

Both are elementwise: each output element needs its own ``x`` value, its rotation partner and
one entry of each table, so the kernels only keep eager's rounding steps (fp32 products and
sums, no FMA contraction) and read every operand once.

``rope`` (diffusers ``apply_rotary_emb``, ``use_real=True``)::

    rot[d] = -x[d + 1] (d even), x[d - 1] (d odd)            # interleaved pairs
    rot[d] = -x[d + D/2] (d < D/2), x[d - D/2] (else)        # rotate-half
    out    = (fp32(x) * cos + fp32(rot) * sin).to(x.dtype)   # each op rounded to fp32

``rope_complex`` (Qwen-Image): the same pairs times one complex table entry each, in complex64
(:func:`complex_product`; in complex128 for a complex128 table, the result rounded to fp32
first), then one rounding to ``x.dtype``.

``rope_even_odd`` (Wan)::

    out[2j]     = p(p(x[2j] * cos[j]) - p(x[2j+1] * sin[j]))     # p: round to promote(x, cos, sin)
    out[2j + 1] = p(p(x[2j] * sin[j]) + p(x[2j+1] * cos[j]))     # then the copy rounds to x.dtype

Negation multiplies by -1 (exact, and -0 for +0 as ``neg`` gives; ``0 - x`` would not).
Outputs take the layout ``like(x)`` (:mod:`sgdiff.kernels.layout`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import like_strides
from sgdiff.kernels.rope_matrix import rope_matrix_reference
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import (
    DTYPES,
    TL_DTYPE,
    cached_plan,
    launch_rows,
    row_offsets,
    rows_fit,
    shape4,
    strides4,
)


@LeanKernel
@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    n_rows, n1: tl.constexpr, n2: tl.constexpr, D,  # n1, n2 compiled in: row indices by constant divisors
    sx0, sx1, sx2, sx3,
    sc0, sc1, sc2, sc3,
    ss0, ss1, ss2, ss3,
    so0, so1, so2, so3,
    FORM: tl.constexpr,  # 0 interleaved, 1 rotate-half, 2 even/odd (Wan), 3 complex product (cos_ptr: the
                         # complex table's real view, fp32 or fp64, x's shape; sin_ptr unused), 4 rotation matrix
                         # (cos_ptr: the [..., D/2, 2, 2] table as [..., 2D] rows; sin_ptr unused)
    PRODUCT_DTYPE: tl.constexpr,  # even/odd: promote(x, cos, sin); matrix: the dtype the sum is rounded to
                                  # before the store's (Kandinsky 5's .to(bfloat16) of an fp32 x)
    FROM_ZERO: tl.constexpr,  # matrix only: the sum starts from +0, as ATen's sum(-1) does
    COMPLEX_FMA: tl.constexpr,  # complex only: which products nvcc contracts (see complex_product)
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    c_row = cos_ptr + row_offsets(rows, n1, n2, sc0, sc1, sc2)[:, None]
    s_row = sin_ptr + row_offsets(rows, n1, n2, ss0, ss1, ss2)[:, None]
    o_row = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None]
    grid_dependency_wait()
    if FORM == 1:  # rotate-half: the tile spans BLOCK_D // 2 columns of each half of the rows
        half = D // 2
        e = tl.program_id(1) * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
        hmask = (rows < n_rows)[:, None] & (e < half)[None, :]
        e2 = e + half
        x1 = tl.load(x_row + e[None, :] * sx3, mask=hmask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + e2[None, :] * sx3, mask=hmask, other=0.0).to(tl.float32)
        # each product and the sum rounded to PRODUCT_DTYPE (fp32: as computed)
        out1 = (_round(x1 * tl.load(c_row + e[None, :] * sc3, mask=hmask, other=0.0).to(tl.float32), PRODUCT_DTYPE)
                + _round((x2 * -1.0) * tl.load(s_row + e[None, :] * ss3, mask=hmask, other=0.0).to(tl.float32),
                         PRODUCT_DTYPE))
        out2 = (_round(x2 * tl.load(c_row + e2[None, :] * sc3, mask=hmask, other=0.0).to(tl.float32), PRODUCT_DTYPE)
                + _round(x1 * tl.load(s_row + e2[None, :] * ss3, mask=hmask, other=0.0).to(tl.float32),
                         PRODUCT_DTYPE))
        out1, out2 = _round(out1, PRODUCT_DTYPE), _round(out2, PRODUCT_DTYPE)
        tl.store(o_row + e[None, :] * so3, out1.to(out_ptr.dtype.element_ty), mask=hmask)
        tl.store(o_row + e2[None, :] * so3, out2.to(out_ptr.dtype.element_ty), mask=hmask)
    else:  # pairs (2j, 2j + 1) sit side by side: split the tile into its even and odd columns
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask = (rows < n_rows)[:, None] & (d < D)[None, :]
        x = tl.load(x_row + d[None, :] * sx3, mask=mask, other=0.0).to(tl.float32)
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_R, BLOCK_D // 2, 2)))
        if FORM == 0:
            cos = tl.load(c_row + d[None, :] * sc3, mask=mask, other=0.0).to(tl.float32)
            sin = tl.load(s_row + d[None, :] * ss3, mask=mask, other=0.0).to(tl.float32)
            cos_even, cos_odd = tl.split(tl.reshape(cos, (BLOCK_R, BLOCK_D // 2, 2)))
            sin_even, sin_odd = tl.split(tl.reshape(sin, (BLOCK_R, BLOCK_D // 2, 2)))
            out_even = _round(_round(x_even * cos_even, PRODUCT_DTYPE)
                              + _round((x_odd * -1.0) * sin_even, PRODUCT_DTYPE), PRODUCT_DTYPE)
            out_odd = _round(_round(x_odd * cos_odd, PRODUCT_DTYPE) + _round(x_even * sin_odd, PRODUCT_DTYPE),
                             PRODUCT_DTYPE)
        elif FORM == 4:  # out[2j + i] = t[j, i, 0] * x[2j] + t[j, i, 1] * x[2j + 1], the table's 4 entries a pair
            j = tl.program_id(1) * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
            pair_mask = (rows < n_rows)[:, None] & (2 * j < D)[None, :]
            t = c_row + (4 * j)[None, :] * sc3
            t00 = tl.load(t, mask=pair_mask, other=0.0).to(tl.float32)
            t01 = tl.load(t + sc3, mask=pair_mask, other=0.0).to(tl.float32)
            t10 = tl.load(t + 2 * sc3, mask=pair_mask, other=0.0).to(tl.float32)
            t11 = tl.load(t + 3 * sc3, mask=pair_mask, other=0.0).to(tl.float32)
            if FROM_ZERO:  # ATen's sum: its accumulator starts at +0 (a pair of -0 products sums to +0)
                out_even = (0.0 + t00 * x_even) + t01 * x_odd
                out_odd = (0.0 + t10 * x_even) + t11 * x_odd
            else:
                out_even = t00 * x_even + t01 * x_odd
                out_odd = t10 * x_even + t11 * x_odd
            out_even, out_odd = _round(out_even, PRODUCT_DTYPE), _round(out_odd, PRODUCT_DTYPE)
        elif FORM == 3:  # (x_even + i x_odd) * (cos + i sin) in complex64, the table's (cos, sin)
            # pairs side by side as x's pairs are (its fp32 view): one contiguous load, split alike
            tab = tl.load(c_row + d[None, :] * sc3, mask=mask, other=0.0)
            cos, sin = tl.split(tl.reshape(tab, (BLOCK_R, BLOCK_D // 2, 2)))
            # in the table's precision (complex128: x widened exactly to fp64), then to fp32 first (ATen's
            # cast from double rounds to float on the way to a 16-bit dtype)
            out_even, out_odd = complex_product(x_even.to(cos.dtype), x_odd.to(cos.dtype), cos, sin, COMPLEX_FMA)
            out_even, out_odd = out_even.to(tl.float32), out_odd.to(tl.float32)
        else:  # one table entry per pair
            j = tl.program_id(1) * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
            pair_mask = (rows < n_rows)[:, None] & (2 * j < D)[None, :]
            cos = tl.load(c_row + j[None, :] * sc3, mask=pair_mask, other=0.0).to(tl.float32)
            sin = tl.load(s_row + j[None, :] * ss3, mask=pair_mask, other=0.0).to(tl.float32)
            out_even, out_odd = even_odd_pairs(x_even, x_odd, cos, sin, PRODUCT_DTYPE)
        out = tl.reshape(tl.join(out_even, out_odd), (BLOCK_R, BLOCK_D))
        tl.store(o_row + d[None, :] * so3, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round(v, dtype: tl.constexpr):
    return v.to(dtype).to(tl.float32)


@triton.jit
def even_odd_pairs(x_even, x_odd, cos, sin, PRODUCT_DTYPE: tl.constexpr):
    """Wan's rotation of pairs (fp32 tiles, one table entry a pair): ``x1 * cos - x2 * sin`` and
    ``x1 * sin + x2 * cos``, each op rounded to PRODUCT_DTYPE (the caller rounds to the output's)."""
    out_even = (_round(x_even * cos, PRODUCT_DTYPE) - _round(x_odd * sin, PRODUCT_DTYPE)).to(PRODUCT_DTYPE)
    out_odd = (_round(x_even * sin, PRODUCT_DTYPE) + _round(x_odd * cos, PRODUCT_DTYPE)).to(PRODUCT_DTYPE)
    return out_even, out_odd


@triton.jit
def complex_product(a, b, c, d, FMA: tl.constexpr):
    """``(a + bi) * (c + di)`` as c10::complex's ``operator*=`` writes it, ``(a*c - b*d, a*d + b*c)``,
    with the products nvcc contracts into FMAs: ``FMA = 3 * real + imag``, where real is
    0 ``a*c - b*d``, 1 ``fma(a, c, -(b*d))``, 2 ``fma(-b, d, a*c)`` and imag is 0 ``a*d + b*c``,
    1 ``fma(a, d, b*c)``, 2 ``fma(b, c, a*d)``. Negation is ``* -1`` (a sign flip, as fneg)."""
    REAL: tl.constexpr = FMA // 3
    IMAG: tl.constexpr = FMA % 3
    if REAL == 0:
        re = a * c - b * d
    elif REAL == 1:
        re = tl.fma(a, c, (b * d) * -1.0)
    else:
        re = tl.fma(b * -1.0, d, a * c)
    if IMAG == 0:
        im = a * d + b * c
    elif IMAG == 1:
        im = tl.fma(a, d, b * c)
    else:
        im = tl.fma(b, c, a * d)
    return re, im


def tables_ok(x, cos, sin, table_shape) -> bool:
    for t in (cos, sin):
        if t.dtype not in DTYPES or t.device != x.device or t.dim() > x.dim():
            return False
        try:
            if tuple(torch.broadcast_shapes(t.shape, table_shape)) != tuple(table_shape):
                return False
        except RuntimeError:
            return False
    return True


def _x_ok(x) -> bool:
    return (x.dtype in DTYPES and 1 <= x.dim() <= 4 and x.numel() > 0 and rows_fit(x, x.shape[-1])
            and x.shape[-1] % 2 == 0 and x.shape[-1] <= 1024)


def supported_layout(x, cos, sin, interleaved, arith_dtype=None) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not _x_ok(x) or not tables_ok(x, cos, sin, x.shape):
        return False
    if arith_dtype is not None:  # x * cos + rot * sin as written: both products in arith_dtype
        return torch.promote_types(x.dtype, cos.dtype) == torch.promote_types(x.dtype, sin.dtype) == arith_dtype
    # eager computes x * cos in promote(fp32, cos) and rounds once to x.dtype
    return torch.promote_types(torch.float32, torch.promote_types(cos.dtype, sin.dtype)) == torch.float32


def can_use(x, cos, sin, interleaved, arith_dtype=None) -> bool:
    return x.is_cuda and supported_layout(x, cos, sin, interleaved, arith_dtype)


def supported_layout_even_odd(x, cos, sin) -> bool:
    return _x_ok(x) and tables_ok(x, cos, sin, (*x.shape[:-1], x.shape[-1] // 2))


def can_use_even_odd(x, cos, sin) -> bool:
    return x.is_cuda and supported_layout_even_odd(x, cos, sin)


@cached_plan
def _plan(x, cos, sin, table_shape, form, out_strides=None):
    shape = shape4(x.shape)
    out = torch.empty_strided(x.shape, out_strides or like_strides(x), device="meta")
    n_rows = shape[0] * shape[1] * shape[2]
    grid, block_r, block_d = launch_rows(n_rows, shape[3])
    ints = (n_rows, shape[1], shape[2], shape[3], *strides4(x, x.shape), *strides4(cos, table_shape),
            *strides4(sin, table_shape), *strides4(out, x.shape))
    return out.stride(), grid, ints, dict(BLOCK_R=block_r, BLOCK_D=block_d)


def _bind(x, cos, sin, table_shape, form, product_dtype, complex_fma=0, from_zero=False, out_dtype=None,
          out_strides=None):
    """``launch(x, cos, sin)`` for inputs of this signature; the output like x, or ``out_strides``."""
    out_strides, grid, ints, blocks = _plan(x, cos, sin, table_shape, form, out_strides)
    kernel = _rope_kernel.bind(grid, FORM=form, PRODUCT_DTYPE=TL_DTYPE[product_dtype], COMPLEX_FMA=complex_fma,
                                FROM_ZERO=from_zero, **blocks, num_warps=4, enable_fp_fusion=False)
    shape, dtype = x.shape, out_dtype or x.dtype

    def launch(x, cos, sin):
        out = torch.empty_strided(shape, out_strides, dtype=dtype, device=x.device)
        kernel(x, cos, sin, out, *ints)
        return out

    return launch


def bind(x, cos, sin, interleaved, arith_dtype=None):
    """:func:`rope` for inputs of this signature, its host arithmetic done."""
    launch = _bind(x, cos, sin, x.shape, 0 if interleaved else 1, arith_dtype or torch.float32,
                   out_dtype=arith_dtype)
    return lambda x, cos, sin, *_: launch(x, cos, sin)


def rope(x, cos, sin, interleaved, arith_dtype=None):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, cos, sin, interleaved, arith_dtype)(x, cos, sin)


def bind_even_odd(x, cos, sin):
    """:func:`rope_even_odd` for inputs of this signature, its host arithmetic done."""
    product = torch.promote_types(x.dtype, torch.promote_types(cos.dtype, sin.dtype))
    return _bind(x, cos, sin, (*x.shape[:-1], x.shape[-1] // 2), 2, product)


def rope_even_odd(x, cos, sin):
    """Launch; the caller has checked :func:`can_use_even_odd`."""
    return bind_even_odd(x, cos, sin)(x, cos, sin)


#: the contraction ATen's complex multiply gets from nvcc (complex_product's FMA). Not yet pinned
#: on a GPU: tests/gpu/test_rowwise_ops_gpu.py::test_rope_complex_contraction says which of the
#: nine variants is bitwise eager's; until then dispatch's first-sight check decides.
COMPLEX_FMA = 4


def supported_layout_complex(x, freqs) -> bool:
    if not (_x_ok(x) and freqs.dtype in (torch.complex64, torch.complex128) and freqs.device == x.device
            and freqs.dim() <= x.dim()):
        return False
    if freqs.shape[-1] != x.shape[-1] // 2:  # an entry a pair: the table's pairs line up with x's
        return False
    try:
        return tuple(torch.broadcast_shapes(freqs.shape, (*x.shape[:-1], x.shape[-1] // 2))) == \
            (*x.shape[:-1], x.shape[-1] // 2)
    except RuntimeError:
        return False


def can_use_complex(x, freqs) -> bool:
    return x.is_cuda and supported_layout_complex(x, freqs)


def _pairs(freqs):
    """complex ``freqs`` ``[..., D/2]`` as its real (real, imaginary) pairs, ``[..., D]``: a view
    where a table entry's two parts sit side by side, as they do in memory (else a copy)."""
    return torch.view_as_real(freqs).flatten(-2)


def bind_complex(x, freqs, complex_fma=None):
    """:func:`rope_complex` for inputs of this signature, its host arithmetic done."""
    launch = _bind(x, _pairs(freqs), x, x.shape, 3, torch.float32, COMPLEX_FMA if complex_fma is None else complex_fma)
    return lambda x, freqs, *_: launch(x, _pairs(freqs), x)


def rope_complex(x, freqs, complex_fma=None):
    """Launch; the caller has checked :func:`can_use_complex`."""
    return bind_complex(x, freqs, complex_fma)(x, freqs)


def _table_rows(x, table):
    """The rotation table broadcast to [*x.shape[:-1], D/2, 2, 2] as [*x.shape[:-1], 2D] rows (a
    view: the three pair dims strided (4s, 2s, s)), or None where it is not such a view."""
    d = x.shape[-1]
    try:
        full = table.broadcast_to((*x.shape[:-1], d // 2, 2, 2))
    except RuntimeError:
        return None
    s = full.stride(-1)
    if s == 0 or full.stride()[-3:] != (4 * s, 2 * s, s):
        return None
    return full.flatten(-3)


def supported_layout_matrix(x, table, from_zero, mid_dtype=None, out_dtype=None) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    if not _x_ok(x) or table.dtype not in DTYPES or table.device != x.device or table.dim() > x.dim() + 2:
        return False
    if any(dt is not None and dt not in DTYPES for dt in (mid_dtype, out_dtype)):
        return False
    # the products in promote(fp32, table) = fp32
    return _table_rows(x, table) is not None


def can_use_matrix(x, table, from_zero, mid_dtype=None, out_dtype=None) -> bool:
    return x.is_cuda and supported_layout_matrix(x, table, from_zero, mid_dtype, out_dtype)


def bind_matrix(x, table, from_zero, mid_dtype=None, out_dtype=None):
    """:func:`rope_matrix` for inputs of this signature, its host arithmetic done."""
    rows = _table_rows(x, table)
    # the output's layout is the chain's (the reference's on meta tensors: its reshape and sum
    # leave some layouts contiguous where x is not)
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (x, table)]
    out_strides = tuple(rope_matrix_reference(*meta, from_zero, mid_dtype, out_dtype).stride())
    launch = _bind(x, rows, rows, rows.shape, 4, mid_dtype or torch.float32, from_zero=from_zero,
                   out_dtype=out_dtype or mid_dtype or torch.float32, out_strides=out_strides)

    # a call's table has the bound one's geometry (the signature), and its [..., 2D] rows view starts
    # where the table does: the kernel reads the table itself by the strides bound above, no view per call
    return lambda x, table, *_: launch(x, table, table)


def rope_matrix(x, table, from_zero, mid_dtype=None, out_dtype=None):
    """Launch; the caller has checked :func:`can_use_matrix`."""
    return bind_matrix(x, table, from_zero, mid_dtype, out_dtype)(x, table)


ROPE = Impl(run=rope, supports=supported_layout, bind=bind)
ROPE_MATRIX = Impl(run=rope_matrix, supports=supported_layout_matrix, bind=bind_matrix)
ROPE_EVEN_ODD = Impl(run=rope_even_odd, supports=supported_layout_even_odd, bind=bind_even_odd)
ROPE_COMPLEX = Impl(run=rope_complex, supports=supported_layout_complex, bind=bind_complex)
