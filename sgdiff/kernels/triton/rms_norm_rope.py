"""Triton sgdiff::rms_norm_rope, bitwise equal to eager on CUDA: ATen's fused RMSNorm
(``F.rms_norm``) over ``head_dim`` = 128, then the rotary embedding, on one register tile.

The norm is :func:`sgdiff.kernels.triton.rms_norm.fused_sum_squares` and
:func:`~sgdiff.kernels.triton.rms_norm.fused_inv_rms` with 32 threads per row (ATen's
warps 1-3 hold nothing at 128 columns); its output is rounded to ``x.dtype`` as eager stores
it, then rotated as :mod:`sgdiff.kernels.triton.rope` does (fp32 products and sum, ``-x`` as
``x * -1``, one rounding). Inputs the fused RMSNorm kernel or the RoPE kernel would refuse are
refused here too, and other head sizes are left to the two ops.

``rms_norm_cat_rope`` is the same for Flux's double blocks, whose text and image queries are
normalized apart and joined along the sequence before the rotation: each output row is read
from the input (and normalized with the weight) it comes from.

``rms_norm_heads_rope`` normalizes a whole row of heads (Wan's QK norm over ``heads * head_dim``)
as the fused RMSNorm kernel of :mod:`sgdiff.kernels.triton.rms_norm` does (ATen's 128 threads a
row, 4-vectors, chunks of 512 columns), rounds it, and rotates each chunk's whole heads in
registers: sgdiff::rope's interleaved or rotate-half math, or sgdiff::rope_even_odd's (Wan's
``x1 * cos - x2 * sin`` with half-width tables, each op rounded to the promoted dtype).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.layout import like_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.rms_norm_heads_rope import ROTATIONS
from sgdiff.kernels.triton import rms_norm as trms
from sgdiff.kernels.triton import rope as trope
from sgdiff.kernels.triton.cuda_math import INTERPRET
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rms_norm import FLT_EPSILON, fused_inv_rms, fused_sum_squares
from sgdiff.kernels.triton.rope import even_odd_pairs
from sgdiff.kernels.triton.rows import TL_DTYPE, cached_plan, halves, row_index, row_offsets, shape4, strides4

HEAD_DIM = 128  # one 4-vector per thread of a warp


@LeanKernel
@triton.jit
def _rms_norm_rope_kernel(
    x_ptr, w_ptr, x1_ptr, w1_ptr, cos_ptr, sin_ptr, out_ptr,
    n_rows, n1: tl.constexpr, n2: tl.constexpr, split,  # n1, n2 compiled in: row indices by constant divisors
    sx0, sx1, sx2,
    sy0, sy1, sy2,
    sc0, sc1, sc2, sc3,
    ss0, ss1, ss2, ss3,
    so0, so1, so2,
    eps,
    HAS_WEIGHT: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TWO: tl.constexpr,  # rows i1 < split of the output from x (and w), the others from x1 (and w1)
    BLOCK_R: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    D: tl.constexpr = 128
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = (rows < n_rows)[:, None]
    d = tl.arange(0, D)
    if TWO:  # the output is cat([x, x1], dim=1) of [n0, n1, n2, D] rows, each normalized
        i0, i1, i2 = row_index(rows, n1, n2)
        first = (i1 < split)[:, None]
        i0, i2 = i0.to(tl.int64), i2.to(tl.int64)
        x_row = tl.where(first, x_ptr + (i0 * sx0 + i1.to(tl.int64) * sx1 + i2 * sx2)[:, None],
                         x1_ptr + (i0 * sy0 + (i1 - split).to(tl.int64) * sy1 + i2 * sy2)[:, None])
    else:
        x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    grid_dependency_wait()
    # the query or key projection is dead after this kernel and evicted first, the tables (every
    # head's, the next kernel's and the next block's) last (measured: bench/results/README.md)
    v = tl.load(x_row + d[None, :], mask=row_ok, other=0.0, eviction_policy="evict_first")
    r = fused_inv_rms(fused_sum_squares(tl.zeros((BLOCK_R, 32), tl.float32), v), D, eps, INTERPRET)
    y = r[:, None] * v.to(tl.float32)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + d).to(tl.float32)[None, :]
        if TWO:
            w = tl.where(first, w, tl.load(w1_ptr + d).to(tl.float32)[None, :])
        y = w * y
    y = y.to(out_ptr.dtype.element_ty).to(tl.float32)  # the norm's output, as eager stores it
    cos = tl.load(cos_ptr + row_offsets(rows, n1, n2, sc0, sc1, sc2)[:, None] + d[None, :] * sc3, mask=row_ok,
                  other=0.0, eviction_policy="evict_last").to(tl.float32)
    sin = tl.load(sin_ptr + row_offsets(rows, n1, n2, ss0, ss1, ss2)[:, None] + d[None, :] * ss3, mask=row_ok,
                  other=0.0, eviction_policy="evict_last").to(tl.float32)
    out = rotated(y, cos, sin, INTERLEAVED)
    o = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None] + d[None, :]
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def rotated(y, cos, sin, INTERLEAVED: tl.constexpr):
    """sgdiff::rope of a [R, D] tile of heads (fp32 ``y``, as rounded to the input's dtype, and
    its tables): fp32 products and sum, ``-x`` as ``x * -1``; the caller rounds once."""
    R: tl.constexpr = y.shape[0]
    D: tl.constexpr = y.shape[1]
    if INTERLEAVED:  # pairs (2j, 2j + 1) side by side
        y0, y1 = tl.split(tl.reshape(y, (R, D // 2, 2)))
        c0, c1 = tl.split(tl.reshape(cos, (R, D // 2, 2)))
        s0, s1 = tl.split(tl.reshape(sin, (R, D // 2, 2)))
        out = tl.reshape(tl.join(y0 * c0 + (y1 * -1.0) * s0, y1 * c1 + y0 * s1), (R, D))
    else:  # rotate-half: columns j and j + D/2
        y0, y1 = halves(y)
        c0, c1 = halves(cos)
        s0, s1 = halves(sin)
        out = tl.reshape(tl.permute(tl.join(y0 * c0 + (y1 * -1.0) * s0, y1 * c1 + y0 * s1), (0, 2, 1)), (R, D))
    return out


@LeanKernel
@triton.jit
def _rms_norm_heads_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    n_rows, n1, n2, N,
    sx0, sx1, sx2,
    so0, so1, so2,
    sc0, sc1, sc2, sch, scd,  # the tables' strides over the rows, the heads and head_dim
    ss0, ss1, ss2, ssh, ssd,
    eps,
    D: tl.constexpr,  # head_dim; the row is N / D heads
    ITERS: tl.constexpr,  # 4-vectors per thread: ceil(N / (4 * THREADS))
    THREADS: tl.constexpr,  # 128 as ATen; 32 when N <= 128
    HAS_WEIGHT: tl.constexpr,
    ROTATION: tl.constexpr,  # 0 interleaved, 1 halves (sgdiff::rope), 2 even/odd slots (sgdiff::rope_even_odd)
    PRODUCT_DTYPE: tl.constexpr,  # even/odd: promote(x, cos, sin), each op's rounding
    BLOCK_R: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """ATen's fused RMSNorm over a whole row of heads (as :func:`.rms_norm._rms_norm_fused_kernel`
    computes it), its output rounded to the input's dtype, then each head of it rotated
    (:func:`rotated`, or :func:`.rope.even_odd_pairs` with a table entry a pair): a chunk of
    ``4 * THREADS`` columns holds whole heads."""
    C: tl.constexpr = 4 * THREADS
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    x_row = x_ptr + row_offsets(rows, n1, n2, sx0, sx1, sx2)[:, None]
    o_row = out_ptr + row_offsets(rows, n1, n2, so0, so1, so2)[:, None]
    c_row = cos_ptr + row_offsets(rows, n1, n2, sc0, sc1, sc2)[:, None]
    s_row = sin_ptr + row_offsets(rows, n1, n2, ss0, ss1, ss2)[:, None]
    cols = tl.arange(0, C)
    acc = tl.zeros((BLOCK_R, THREADS), tl.float32)
    grid_dependency_wait()
    for k in tl.static_range(ITERS):  # read twice where the row is several chunks, as the norm's kernel
        col = cols + k * C
        v = tl.load(x_row + col[None, :], mask=row_ok[:, None] & (col < N)[None, :], other=0.0,
                    eviction_policy="evict_last" if ITERS > 1 else "evict_first")
        acc = fused_sum_squares(acc, v)
    r = fused_inv_rms(acc, N, eps, INTERPRET)[:, None]
    for k in tl.static_range(ITERS):
        col = cols + k * C
        mask = row_ok[:, None] & (col < N)[None, :]
        if ITERS > 1:
            v = tl.load(x_row + col[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
        y = r * v.to(tl.float32)
        if HAS_WEIGHT:
            y = tl.load(w_ptr + col, mask=col < N, other=0.0).to(tl.float32)[None, :] * y
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)  # the norm's output, as eager stores it
        head, d = col // D, col % D
        if ROTATION == 2:
            d = d // 2  # one table entry a pair, read at both of its columns
        cos = tl.load(c_row + (head * sch + d * scd)[None, :], mask=mask, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        sin = tl.load(s_row + (head * ssh + d * ssd)[None, :], mask=mask, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        if ROTATION == 2:
            y_even, y_odd = tl.split(tl.reshape(y, (BLOCK_R, C // 2, 2)))
            cos, _ = tl.split(tl.reshape(cos, (BLOCK_R, C // 2, 2)))
            sin, _ = tl.split(tl.reshape(sin, (BLOCK_R, C // 2, 2)))
            out_even, out_odd = even_odd_pairs(y_even, y_odd, cos, sin, PRODUCT_DTYPE)
            out = tl.reshape(tl.join(out_even, out_odd), (BLOCK_R, C))
        else:
            out = tl.reshape(rotated(tl.reshape(y, (BLOCK_R * C // D, D)), tl.reshape(cos, (BLOCK_R * C // D, D)),
                                     tl.reshape(sin, (BLOCK_R * C // D, D)), ROTATION == 0), (BLOCK_R, C))
        tl.store(o_row + col[None, :], out.to(out_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first" if ITERS > 1 else "")


def supported_layout(x, weight, eps, form, cos, sin, interleaved) -> bool:
    """can_use without the device check (the interpreter runs the kernel on CPU tensors)."""
    return (form == "fused" and x.dim() >= 1 and x.shape[-1] == HEAD_DIM
            and trms.supported_layout(x, weight, eps, form) and trope.supported_layout(x, cos, sin, interleaved))


def supported_layout_cat(x0, w0, x1, w1, eps, form, cos, sin, interleaved) -> bool:
    if not (form == "fused" and x0.dim() == x1.dim() == 4 and x0.shape[-1] == HEAD_DIM and x0.dtype == x1.dtype
            and x0.device == x1.device and x0.shape[0] == x1.shape[0] and x0.shape[2:] == x1.shape[2:]
            and (w0 is None) == (w1 is None)):
        return False
    out_shape = (x0.shape[0], x0.shape[1] + x1.shape[1], *x0.shape[2:])
    fp32_math = torch.promote_types(torch.float32, torch.promote_types(cos.dtype, sin.dtype)) == torch.float32
    return (fp32_math and trope.tables_ok(x0, cos, sin, out_shape)
            and trms.supported_layout(x0, w0, eps, form) and trms.supported_layout(x1, w1, eps, form))


def heads_view(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``x`` ``[..., H * D]`` seen ``[..., H, D]`` (a view)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads))


def supported_layout_heads(x, weight, eps, form, heads, cos, sin, rotation) -> bool:
    """A fused RMSNorm over a row of ``heads`` whole heads (up to 3 leading dims, head_dim even
    and dividing the kernel's chunk of 512 columns, or 128 for rows up to 128), its tables
    rotating each head as sgdiff::rope's or sgdiff::rope_even_odd's kernel would."""
    if not (form == "fused" and 2 <= x.dim() <= 4 and isinstance(heads, int) and heads > 0
            and x.shape[-1] % heads == 0 and rotation in ROTATIONS):
        return False
    d, chunk = x.shape[-1] // heads, (128 if x.shape[-1] <= 128 else 512)
    if not (d % 2 == 0 and chunk % d == 0 and trms.supported_layout(x, weight, eps, form)):
        return False
    if rotation == "even_odd":
        return trope.supported_layout_even_odd(heads_view(x, heads), cos, sin)
    return trope.supported_layout(heads_view(x, heads), cos, sin, rotation == "interleaved")


def can_use(x, weight, eps, form, cos, sin, interleaved) -> bool:
    return x.is_cuda and supported_layout(x, weight, eps, form, cos, sin, interleaved)


def can_use_cat(x0, w0, x1, w1, eps, form, cos, sin, interleaved) -> bool:
    return x0.is_cuda and supported_layout_cat(x0, w0, x1, w1, eps, form, cos, sin, interleaved)


@cached_plan
def _plan(x0, x1, cos, sin, out_shape):
    shape = shape4(out_shape)
    n_rows = shape[0] * shape[1] * shape[2]
    one = x1 is None
    out_strides = like_strides(x0) if one else torch.empty(out_shape, device="meta").stride()
    out = torch.empty_strided(out_shape, out_strides, device="meta")
    block_r = 16  # as the fused RMSNorm kernel for 128 columns
    sx = strides4(x0, x0.shape)[:3]
    ints = (n_rows, shape[1], shape[2], shape[1] if one else x0.shape[1], *sx,
            *(sx if one else strides4(x1, x1.shape)[:3]), *strides4(cos, out_shape), *strides4(sin, out_shape),
            *strides4(out, out_shape)[:3])
    return out.stride(), (triton.cdiv(n_rows, block_r),), ints, block_r


def _bind(x0, w0, x1, w1, eps, cos, sin, interleaved, out_shape):
    """``launch(x0, w0, x1, w1, cos, sin)`` for inputs of this signature (x1, w1: None for one norm)."""
    out_strides, grid, ints, block_r = _plan(x0, x1, cos, sin, tuple(out_shape))
    kernel = _rms_norm_rope_kernel.bind(
        grid, HAS_WEIGHT=w0 is not None, INTERLEAVED=bool(interleaved), TWO=x1 is not None, BLOCK_R=block_r,
        INTERPRET=INTERPRET, num_warps=2, enable_fp_fusion=False)
    eps = FLT_EPSILON if eps is None else eps

    def launch(x0, w0, x1, w1, cos, sin):
        out = torch.empty_strided(out_shape, out_strides, dtype=x0.dtype, device=x0.device)
        w0 = w0 if w0 is not None else x0
        kernel(x0, w0, x1 if x1 is not None else x0, w1 if w1 is not None else w0, cos, sin, out, *ints, eps)
        return out

    return launch


def bind(x, weight, eps, form, cos, sin, interleaved):
    """:func:`rms_norm_rope` for inputs of this signature, its host arithmetic done."""
    launch = _bind(x, weight, None, None, eps, cos, sin, interleaved, x.shape)
    return lambda x, weight, eps, form, cos, sin, *_: launch(x, weight, None, None, cos, sin)


def rms_norm_rope(x, weight, eps, form, cos, sin, interleaved):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, eps, form, cos, sin, interleaved)(x, weight, eps, form, cos, sin, interleaved)


def bind_cat(x0, w0, x1, w1, eps, form, cos, sin, interleaved):
    """:func:`rms_norm_cat_rope` for inputs of this signature, its host arithmetic done."""
    launch = _bind(x0, w0, x1, w1, eps, cos, sin, interleaved,
                   (x0.shape[0], x0.shape[1] + x1.shape[1], *x0.shape[2:]))
    return lambda x0, w0, x1, w1, eps, form, cos, sin, *_: launch(x0, w0, x1, w1, cos, sin)


@cached_plan
def _plan_heads(x, heads, cos, sin, rotation):
    shape = shape4(x.shape)
    n_rows, n = shape[0] * shape[1] * shape[2], shape[3]
    d = n // heads
    out = torch.empty_strided(x.shape, like_strides(x), device="meta")
    view = (*x.shape[:-1], heads, d // 2 if rotation == "even_odd" else d)  # the tables' shape
    tables = [(0,) * (4 - x.dim()) + t.expand(view).stride() for t in (cos, sin)]  # 3 row strides, head, d
    ints = (n_rows, shape[1], shape[2], n, *strides4(x, x.shape)[:3], *strides4(out, x.shape)[:3], *tables[0],
            *tables[1])
    consts = dict(trms.fused_launch(n), D=d)
    return out.stride(), (triton.cdiv(n_rows, consts["BLOCK_R"]),), ints, consts


def bind_heads(x, weight, eps, form, heads, cos, sin, rotation):
    """:func:`rms_norm_heads_rope` for inputs of this signature, its host arithmetic done."""
    out_strides, grid, ints, consts = _plan_heads(x, heads, cos, sin, rotation)
    product = torch.promote_types(x.dtype, torch.promote_types(cos.dtype, sin.dtype))
    kernel = _rms_norm_heads_rope_kernel.bind(grid, **consts, HAS_WEIGHT=weight is not None,
                                              ROTATION=ROTATIONS.index(rotation),
                                              PRODUCT_DTYPE=TL_DTYPE[product], INTERPRET=INTERPRET,
                                              enable_fp_fusion=False)
    eps = FLT_EPSILON if eps is None else eps
    shape = x.shape

    def launch(x, weight, eps_, form_, heads_, cos, sin, *_):
        out = torch.empty_strided(shape, out_strides, dtype=x.dtype, device=x.device)
        kernel(x, weight if weight is not None else x, cos, sin, out, *ints, eps)
        return heads_view(out, heads)

    return launch


def rms_norm_heads_rope(x, weight, eps, form, heads, cos, sin, rotation):
    """Launch; the caller has checked :func:`supported_layout_heads` and the device."""
    return bind_heads(x, weight, eps, form, heads, cos, sin, rotation)(x, weight, eps, form, heads, cos, sin,
                                                                       rotation)


def rms_norm_cat_rope(x0, w0, x1, w1, eps, form, cos, sin, interleaved):
    """Launch; the caller has checked :func:`can_use_cat`."""
    return bind_cat(x0, w0, x1, w1, eps, form, cos, sin, interleaved)(x0, w0, x1, w1, eps, form, cos, sin,
                                                                     interleaved)


RMS_NORM_ROPE = Impl(run=rms_norm_rope, supports=supported_layout, bind=bind)
RMS_NORM_CAT_ROPE = Impl(run=rms_norm_cat_rope, supports=supported_layout_cat, bind=bind_cat)
RMS_NORM_HEADS_ROPE = Impl(run=rms_norm_heads_rope, supports=supported_layout_heads, bind=bind_heads)
