"""Triton sgdiff::layer_norm, bitwise equal to eager on CUDA.

``F.layer_norm(x, [N], w, b, eps)`` over the last dim of rows of any leading shape, as ATen's
vectorized kernel computes it (dtype T = bf16, fp16 or fp32; with ``x_dtype``/``out_dtype`` a
bf16/fp16 x is read as the fp32 T it is cast to, and the result cast to ``out_dtype`` when
stored, as ``FP32LayerNorm``'s ``F.layer_norm(x.float(), ...).type_as(x)``)::

    y = layer_norm(x, [N], w, b, eps)   # Welford stats (welford.py),
                                        # y = rstd * (x - mean) [fma(w, ., b) when affine]
                                        # rounded once to T

A strided x is normalized as eager normalizes ``x.contiguous()``, into a contiguous output.

It is sgdiff::layernorm_modulate's normalization without the modulation: rows longer than 128
take that op's kernels (:mod:`sgdiff.kernels.triton.layernorm_modulate`) without scale and
shift. Rows of at most 128 (per-head QK norms) pack many rows a program: on CUDA a Gluon
kernel that holds each row as ATen's threads hold it; elsewhere (the interpreter, a Triton
without Gluon or whose Gluon fails on it: logged) a Triton kernel that takes ATen's lane tree
by halving the lane axis.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, rsqrtf, to_fp32
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.layernorm_modulate import _bind, _gluon_or_triton, _norm_ok
from sgdiff.kernels.triton.rows import TL_DTYPE
from sgdiff.kernels.triton.welford import (
    THREADS,
    VEC,
    VEC_C,
    _fold_last_axis,
    _row_lane0,
    aten_affine,
    fold_empty_warps,
    pow2_reciprocal,
    short_rows_welford,
    vector_welford,
    welford_combine,
    welford_combine_pow2,
)

try:  # Triton's layout-explicit dialect (triton >= 3.5); not run by the interpreter
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:
    gluon = None


@triton.jit
def _normalize(x, mean, rstd, w_ptr, b_ptr, col, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """ATen's ``gamma * (rstd * (x - mean)) + beta`` in fp32 (nvcc's FMA), before rounding.
    Masked-off entries are never stored: their loads leave registers as they are."""
    y = rstd * (x - mean)
    w = to_fp32(tl.load(w_ptr + col, mask=mask)) if HAS_WEIGHT else None
    b = to_fp32(tl.load(b_ptr + col, mask=mask)) if HAS_BIAS else None
    return aten_affine(y, rstd, x - mean, w, b)


@LeanKernel
@triton.jit
def _layer_norm_short_rows_kernel(
    x_ptr,  # [M, N] contiguous rows
    w_ptr, b_ptr,  # [N] weight and bias (unused unless HAS_WEIGHT / HAS_BIAS)
    out_ptr,  # [M, N] contiguous
    M, N,  # N a multiple of 4, at most 128
    eps,
    ROWS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DTYPE: tl.constexpr,  # the dtype eager's LayerNorm rounds to (out_ptr's may differ: a cast)
    INTERPRET: tl.constexpr,
):
    """LayerNorm of ROWS short rows (head_dim) per program, each in its own warp's lanes."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    t = tl.arange(0, 32)  # one warp's lanes
    lane = tl.arange(0, VEC_C)
    active = (rows < M)[:, None] & (t < N // VEC_C)[None, :]  # [ROWS, 32]
    col = (t[:, None] * VEC_C + lane[None, :])[None, :, :]  # [1, 32, 4]
    mask = active[:, :, None]
    offs = rows[:, None, None] * N + col
    grid_dependency_wait()
    x = to_fp32(tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first"))  # as the Gluon kernel
    mean, m2, _ = short_rows_welford(x, active)
    var = tl.math.div_rn(m2, tl.full(m2.shape, N, tl.float32))
    rstd = rsqrtf(var + eps, INTERPRET)
    y = _normalize(x, mean[:, None, None], rstd[:, None, None], w_ptr, b_ptr, col, mask, HAS_WEIGHT, HAS_BIAS)
    tl.store(out_ptr + offs, y.to(DTYPE).to(out_ptr.dtype.element_ty), mask=mask)


if gluon is not None:
    @LeanKernel
    @gluon.jit
    def _layer_norm_warp_rows_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr, M,  # as _layer_norm_short_rows_kernel's
        N: gl.constexpr,  # compiled in: every count on the tree's path is then known to the compiler
        eps,
        ROWS: gl.constexpr,
        HAS_WEIGHT: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        DTYPE: gl.constexpr,
        INTERPRET: gl.constexpr,
        LAYOUT: gl.constexpr,  # warp_rows_layout(ROWS, num_warps)
        POW2: gl.constexpr,  # N // 4 a power of two: every count on the tree's path is 0 or 2**e
        EVEN_ROWS: gl.constexpr = False,  # M a multiple of ROWS
    ):
        """_layer_norm_short_rows_kernel with the layout written out (:func:`warp_rows_layout`).

        ATen's thread ``l`` of a row (l = 16 hi + 8 lo + t) folds the row's 4-vector ``l``; here
        lane ``t`` of an 8-lane segment holds the vectors of ATen's threads t, t + 8, t + 16 and
        t + 24 in registers. Shuffle-down's first two levels (offsets 16, 8) pair registers of
        one thread; the last three are ``gl.reduce`` over the 8 lanes, which Triton lowers to a
        butterfly (``shfl.bfly`` at offsets 4, 2, 1, each lane combining (own, other)) whose
        first lane follows shuffle-down's path. Other lanes may end elsewhere (a combine of
        unequal counts is not symmetric), so every lane then takes the first lane's state. No
        shared memory; a row's loads are 8 lanes reading 64 contiguous bytes (bf16) at a time."""
        LANES: gl.constexpr = gl.SliceLayout(2, LAYOUT)  # [ROWS, 32]: ATen's threads' states
        rows = gl.program_id(0).to(gl.int64) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LANES))
        t = gl.arange(0, 32, layout=gl.SliceLayout(0, LANES))
        j = gl.arange(0, VEC_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, LAYOUT)))
        # a lane's columns, broadcast over rows: constants per register (N is compiled in)
        lane_active = gl.zeros([ROWS, 32], gl.int32, LANES) + t[None, :] < N // VEC_C
        if EVEN_ROWS:  # M a multiple of ROWS: no row mask (all-true masks fold away)
            active = lane_active
        else:
            active = (rows < M)[:, None] & lane_active
        col = t[None, :, None] * VEC_C + j[None, None, :]
        mask = active[:, :, None]
        offs = rows[:, None, None] * N + col
        grid_dependency_wait()
        # q or k is dead after its norm: evict-first leaves L2 to the output, which attention reads
        # next
        x = to_fp32(gl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first"))
        even, odd = gl.split(gl.reshape(x, [ROWS, 32, 2, 2]))  # entries (0, 2) and (1, 3)
        x0, x2 = gl.split(even)
        x1, x3 = gl.split(odd)
        # the same layout under another name: no data moves
        x0, x1 = gl.convert_layout(x0, LANES), gl.convert_layout(x1, LANES)
        x2, x3 = gl.convert_layout(x2, LANES), gl.convert_layout(x3, LANES)
        # counts from the columns alone (a row past M is never stored)
        mean, m2, n = vector_welford(x0, x1, x2, x3, lane_active, gl.zeros([ROWS, 32], gl.float32, LANES))
        # ATen's thread l = 16 hi + 8 lo + t: offset 16 pairs hi, then offset 8 pairs lo
        mean = gl.reshape(mean, [ROWS, 2, 2, 8])
        m2 = gl.reshape(m2, [ROWS, 2, 2, 8])
        n = gl.reshape(n, [ROWS, 2, 2, 8])
        mean, m2, n = _fold_last_axis(gl.permute(mean, [0, 2, 3, 1]), gl.permute(m2, [0, 2, 3, 1]),
                                      gl.permute(n, [0, 2, 3, 1]), POW2)
        mean, m2, n = _fold_last_axis(gl.permute(mean, [0, 2, 1]), gl.permute(m2, [0, 2, 1]),
                                      gl.permute(n, [0, 2, 1]), POW2)
        if POW2:
            mean, m2, n = gl.reduce((mean, m2, n), 1, welford_combine_pow2)
        else:
            mean, m2, n = gl.reduce((mean, m2, n), 1, welford_combine)
        mean, m2, n = _row_lane0(mean), _row_lane0(m2), _row_lane0(n)
        mean, m2, n = fold_empty_warps(mean, m2, n, gl.zeros_like(mean), POW2)
        ROW: gl.constexpr = gl.SliceLayout(1, LANES)
        mean, m2 = gl.convert_layout(mean, ROW), gl.convert_layout(m2, ROW)  # the same layout
        if POW2:  # m2 / N with N a power of two: the product with 1 / N, rounded alike
            var = m2 * pow2_reciprocal(gl.full(m2.shape, N, gl.float32, ROW))
        else:
            var = gl.div_rn(m2, gl.full(m2.shape, N, gl.float32, ROW))
        rstd = rsqrtf(var + eps, INTERPRET)
        y = _normalize(x, mean[:, None, None], rstd[:, None, None], w_ptr, b_ptr, col, mask, HAS_WEIGHT, HAS_BIAS)
        gl.store(out_ptr + offs, y.to(DTYPE).to(out_ptr.dtype.element_ty), mask=mask)

    @functools.lru_cache(maxsize=None)
    def warp_rows_layout(rows: int, warps: int):
        """The ``[rows, 32, 4]`` tile (row, ATen thread l, vector entry j) of
        :func:`_layer_norm_warp_rows_kernel`: j and l's bits 3-4 in a thread's registers, l's
        bits 0-2 across a segment of 8 lanes, 4 rows a warp (lane bits 3-4), then rows across
        warps and registers. ``rows`` a multiple of 4 * warps, both powers of two."""
        assert rows % (4 * warps) == 0 and rows & (rows - 1) == 0 and warps & (warps - 1) == 0
        reg = [[0, 0, 1], [0, 0, 2], [0, 8, 0], [0, 16, 0]]
        reg += [[4 * warps << k, 0, 0] for k in range((rows // (4 * warps)).bit_length() - 1)]
        lane = [[0, 1, 0], [0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0]]
        warp = [[4 << k, 0, 0] for k in range(warps.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [rows, 32, 4])

    def warp_rows_options(M: int, N: int, rows: int, warps: int) -> dict:
        """The launch options of :func:`_layer_norm_warp_rows_kernel` for M rows of N and this
        program shape."""
        lanes = N // VEC
        return dict(ROWS=rows, LAYOUT=warp_rows_layout(rows, warps), POW2=lanes & (lanes - 1) == 0,
                    EVEN_ROWS=M % rows == 0, num_warps=warps)
else:
    _layer_norm_warp_rows_kernel = warp_rows_options = None


SHORT_ROW = THREADS  # rows up to one warp's 4-vectors (head_dim <= 128) take the short-rows kernel
SHORT_ROWS_PER_PROGRAM = 16
WARP_ROWS_PROGRAM = (16, 2)  # the Gluon kernel's rows a program and warps (4 rows a warp), as measured


def layer_norm_supported_layout(x, weight, bias, eps, x_dtype=None, out_dtype=None) -> bool:
    """can_use without the device check: rows of any leading shape, normalized as eager
    normalizes ``x.contiguous()``."""
    if not (x.dim() >= 1 and x.numel() > 0 and isinstance(eps, float)):
        return False
    shape = (x.numel() // x.shape[-1], x.shape[-1])
    rows = x.view(shape) if x.is_contiguous() else torch.empty(shape, dtype=x.dtype, device="meta")  # eager's copy
    return _norm_ok(rows, weight, bias, x_dtype, out_dtype, x.device)


def layer_norm_can_use(x, weight, bias, eps, x_dtype=None, out_dtype=None) -> bool:
    return x.is_cuda and layer_norm_supported_layout(x, weight, bias, eps, x_dtype, out_dtype)


def layer_norm_bind(x, weight, bias, eps, x_dtype=None, out_dtype=None):
    """:func:`layer_norm` for inputs of this signature, its host arithmetic done. A strided
    ``x`` is copied contiguous first, as eager's kernel does (in x's dtype: widening it later
    is exact)."""
    shape, view = (x.numel() // x.shape[-1], x.shape[-1]), x.shape
    M, N = shape
    if N > SHORT_ROW:
        rows = torch.empty(shape, dtype=x.dtype, device="meta")  # the geometry of x.contiguous() as rows
        launch = _bind(rows, weight, bias, eps, None, None, False, x_dtype, out_dtype, x.device)
        return lambda x, weight, bias, *_: launch(x.contiguous(), weight, bias, None, None).view(view)
    dtype = x_dtype or x.dtype
    out_dtype = out_dtype or dtype
    options = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, DTYPE=TL_DTYPE[dtype],
                   INTERPRET=INTERPRET, enable_fp_fusion=False)

    def bind_gluon():
        program = warp_rows_options(M, N, *WARP_ROWS_PROGRAM)
        return _layer_norm_warp_rows_kernel.bind((triton.cdiv(M, program["ROWS"]),), **program, **options)

    def bind_triton():
        return _layer_norm_short_rows_kernel.bind((triton.cdiv(M, SHORT_ROWS_PER_PROGRAM),),
                                                   ROWS=SHORT_ROWS_PER_PROGRAM, num_warps=4, **options)

    kernel = _gluon_or_triton(bind_gluon if _layer_norm_warp_rows_kernel is not None else None, bind_triton,
                              f"layer_norm's Gluon kernel for rows of {N}")

    def launch(x, weight, bias, *_):
        rows = x.contiguous()  # the kernel takes pointers: no views
        out = torch.empty(view, dtype=out_dtype, device=x.device)
        kernel(rows, weight if weight is not None else rows, bias if bias is not None else rows, out, M, N, eps)
        return out

    return launch


def layer_norm(x, weight, bias, eps, x_dtype=None, out_dtype=None):
    """Launch; the caller has checked :func:`layer_norm_can_use`."""
    return layer_norm_bind(x, weight, bias, eps, x_dtype, out_dtype)(x, weight, bias)


LAYER_NORM = Impl(run=layer_norm, supports=layer_norm_supported_layout, bind=layer_norm_bind)
