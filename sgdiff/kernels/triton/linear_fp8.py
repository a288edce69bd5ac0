"""sgdiff::linear_fp8 on CUDA: rows quantized to e4m3 by a Triton kernel, the GEMM by
``torch._scaled_mm`` with row-wise scales.

The quantization is the reference's, bit for bit: a row's largest magnitude (a max: exact in
any order), ``scale = max(amax, SCALE_FLOOR) / 448`` and ``inverse = 448 / max(amax,
SCALE_FLOOR)`` as IEEE divisions (``div_rn``, one each a row), ``x * inverse`` clamped to ±448
and rounded to e4m3 to nearest even (``cvt.rn.satfinite``). One program quantizes ``ROWS`` rows,
each held whole (at most ``MAX_K`` values) as two power-of-two tiles (:func:`row_parts`). The
activation is quantized on every call; the weight once: its e4m3 copy and scales are kept per
weight tensor and remade when the weight changes (:class:`QuantizedWeights`). The GEMM is
``torch._scaled_mm`` (cuBLASLt / CUTLASS's row-wise kernel on sm_89 and later) with fast
accumulation (Hopper's FP8 products summed in the tensor cores' accumulator, not promoted to
fp32 every few k-steps: 2-24% faster at DiT shapes on an H200, the output's error against the
unquantized GEMM unchanged to three digits, ``bench/results/runs/h200-2026-12-06.md``), times
the row's and the channel's scale, plus the bias, rounded once to bf16.
"""
from __future__ import annotations

import logging
import weakref
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from sgdiff import _compat
from sgdiff.kernels import dispatch, tuning
from sgdiff.kernels.linear_fp8 import DTYPES, E4M3, E4M3_MAX, MAX_K, SCALE_FLOOR
from sgdiff.kernels.layout import map_tokens, tokens_map, weight_rows
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import to_e4m3
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait

log = logging.getLogger("sgdiff")

ALIGN = 16  # the FP8 GEMM's K and N are multiples of 16


@LeanKernel
@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr,
    M, stride_x,
    K: tl.constexpr,
    ROWS: tl.constexpr,
    MAIN: tl.constexpr,
    TAIL: tl.constexpr,
    SCALE_FLOOR_: tl.constexpr,
    E4M3_MAX_: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    x_rows, q_rows = x_ptr + rows64 * stride_x, q_ptr + rows64 * K
    grid_dependency_wait()
    main = load_row_part(x_rows, 1, row_ok, 0, K, MAIN).to(tl.float32)
    tail = load_row_part(x_rows, 1, row_ok, MAIN, K, TAIL).to(tl.float32)
    amax = row_largest(main, tail)
    inverse = row_inverse(amax, SCALE_FLOOR_, E4M3_MAX_)
    store_row_part(q_rows, row_ok, 0, K, main, inverse, MAIN, E4M3_MAX_)
    store_row_part(q_rows, row_ok, MAIN, K, tail, inverse, TAIL, E4M3_MAX_)
    tl.store(scale_ptr + rows, row_scale(amax, SCALE_FLOOR_, E4M3_MAX_), mask=row_ok)


@triton.jit
def load_row_part(row_ptrs, col_stride, row_ok, start, n, BLOCK: tl.constexpr):
    """Columns ``[start, start + BLOCK)`` of each row (those at ``n`` and past it read as 0)."""
    cols = start + tl.arange(0, BLOCK)
    inside = row_ok[:, None] & (cols < n)[None, :]
    return tl.load(row_ptrs[:, None] + cols[None, :].to(tl.int64) * col_stride, mask=inside, other=0.0)


@triton.jit
def row_largest(main, tail):
    """The largest magnitude of each row held as two tiles (:func:`load_row_part`), in fp32 (a
    max: exact for 16-bit and fp32 tiles alike)."""
    return tl.maximum(tl.max(tl.abs(main), axis=1), tl.max(tl.abs(tail), axis=1)).to(tl.float32)


@triton.jit
def store_row_part(q_rows, row_ok, start, n, x, inverse, BLOCK: tl.constexpr, E4M3_MAX_: tl.constexpr):
    """Columns ``[start, start + BLOCK)`` (below ``n``) of the e4m3 rows: ``x`` (widened to fp32)
    times its row's ``inverse``, clamped to ±448, rounded to e4m3 to nearest even."""
    cols = start + tl.arange(0, BLOCK)
    v = tl.minimum(tl.maximum(x.to(tl.float32) * inverse[:, None], -E4M3_MAX_), E4M3_MAX_)
    tl.store(q_rows[:, None] + cols[None, :], to_e4m3(v), mask=row_ok[:, None] & (cols < n)[None, :])


@triton.jit
def row_scale(amax, SCALE_FLOOR_: tl.constexpr, E4M3_MAX_: tl.constexpr):
    """Each row's scale from its largest magnitude: ``max(amax, SCALE_FLOOR) / 448``, IEEE-divided."""
    return tl.math.div_rn(tl.maximum(amax, SCALE_FLOOR_), tl.full(amax.shape, E4M3_MAX_, tl.float32))


@triton.jit
def row_inverse(amax, SCALE_FLOOR_: tl.constexpr, E4M3_MAX_: tl.constexpr):
    """What each row's values are multiplied by: ``448 / max(amax, SCALE_FLOOR)``, IEEE-divided."""
    return tl.math.div_rn(tl.full(amax.shape, E4M3_MAX_, tl.float32), tl.maximum(amax, SCALE_FLOOR_))


def row_parts(k: int) -> Tuple[int, int]:
    """``(MAIN, TAIL)``: a row of ``k`` values as two power-of-two tiles, the largest power of two
    up to ``k`` and the smallest one (at least 16) holding the rest, so that a program's lanes
    past ``k`` are few (8960 values: 8192 + 1024, not 16384)."""
    main = 1 << (k.bit_length() - 1)
    return main, max(16, triton.next_power_of_2(k - main))


def rows_and_warps(k: int) -> Tuple[int, int]:
    """``(ROWS, num_warps)`` for a quantizing program holding ``ROWS`` rows of ``k`` values whole:
    about 4096 values a program or one row, 12 to 24 values a thread on up to 16 warps."""
    main, tail = row_parts(k)
    rows = max(1, 4096 // main)
    return rows, min(16, max(4, triton.next_power_of_2(rows * (main + tail)) // 512))


def _quantizer(m: int, k: int):
    """``quantize(x, out=None)`` of ``[m, k]`` rows with unit column stride, its launch bound to
    that geometry (a call site's calls keep it, and their row stride)."""
    (rows, warps), (main, tail) = rows_and_warps(k), row_parts(k)
    kernel = _quantize_rows_kernel.bind((triton.cdiv(m, rows),), K=k, ROWS=rows, MAIN=main, TAIL=tail,
                                        SCALE_FLOOR_=SCALE_FLOOR, E4M3_MAX_=E4M3_MAX, num_warps=warps)

    def quantize(x, out=None):
        q, scale = out if out is not None else (torch.empty((m, k), dtype=E4M3, device=x.device),
                                                torch.empty((m, 1), dtype=torch.float32, device=x.device))
        kernel(x, q, scale, m, x.stride(0))
        return q, scale

    return quantize


def quantize_rows(x: torch.Tensor, out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """``(q, scale)`` of a 2-D ``x`` (unit column stride): e4m3 ``[M, K]`` and fp32 ``[M, 1]``,
    as :func:`sgdiff.kernels.linear_fp8.quantize_rows_reference` computes them (into ``out``'s
    two contiguous tensors where given)."""
    return _quantizer(*x.shape)(x, out)


def _state(t: torch.Tensor) -> Tuple[int, int]:
    """``t``'s address and version: what new storage or an in-place update changes."""
    return t.data_ptr(), _compat.version(t)


class QuantizedWeights:
    """The e4m3 copy and scales of each weight seen, or of several weights side by side (with
    their biases side by side), made once and remade when one of its tensors changes.

    An entry belongs to its tensor objects (held weakly, dropped with any of them) and is good
    while each keeps its storage address and version (an in-place update bumps the version;
    ``.data`` reassigned moves the address). Another tensor over the same memory (an alias made
    per call) gets an entry of its own: a copy too many, never a stale one. A copy is remade in
    its own memory, where a CUDA graph that read it reads it again. An edit through ``.data``
    changes neither address nor version: :meth:`refresh` (``sgdiff.refresh_weights()``) remakes
    every copy.
    """

    def __init__(self):
        self._entries: Dict[tuple, list] = {}

    def get(self, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The copy of ``w`` (``[N, K]``, or a pointwise convolution's ``[N, K, 1, 1]``) as e4m3
        ``[N, K]`` rows and their fp32 scales ``[1, N]``."""
        q, scale, _ = self.side_by_side((w,))
        return q, scale

    def side_by_side(self, weights, biases=()) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The copies of ``weights`` (each ``[N_i, K]``) one after the other, e4m3 ``[sum N_i, K]``
        rows and fp32 scales ``[1, sum N_i]``, and ``biases`` (one a weight, or none) side by side
        (``None`` without)."""
        tensors = (*weights, *biases)
        key = tuple(map(id, tensors))
        entry = self._entries.get(key)
        if entry is not None and all(ref() is t for ref, t in zip(entry[0], tensors)) \
                and entry[2].shape == _side_by_side_shape(weights):
            if entry[1] != tuple(map(_state, tensors)):
                self._remake(entry, weights, biases)
            return entry[2], entry[3], entry[4]
        n, k = _side_by_side_shape(weights)
        w0 = weights[0]
        entry = [None, None, torch.empty((n, k), dtype=E4M3, device=w0.device),
                 torch.empty((1, n), dtype=torch.float32, device=w0.device),
                 torch.empty((n,), dtype=biases[0].dtype, device=w0.device) if biases else None]
        self._remake(entry, weights, biases)
        try:
            entry[0] = [weakref.ref(t, lambda _, key=key, entries=self._entries: entries.pop(key, None))
                        for t in tensors]
        except TypeError:  # not weakly referable: keep nothing
            return entry[2], entry[3], entry[4]
        self._entries[key] = entry
        log.debug("sgdiff: linear_fp8 quantized %s weights", [tuple(w.shape) for w in weights])
        return entry[2], entry[3], entry[4]

    @staticmethod
    def _remake(entry: list, weights, biases) -> None:
        """Quantize each weight into its rows of the entry's copy, and lay the biases side by side."""
        start, scales = 0, entry[3].view(-1, 1)
        for w in weights:
            rows = weight_rows(w)
            quantize_rows(rows, (entry[2][start:start + rows.shape[0]], scales[start:start + rows.shape[0]]))
            start += rows.shape[0]
        if biases:
            torch.cat(biases, out=entry[4])
        entry[1] = tuple(map(_state, (*weights, *biases)))

    def refresh(self) -> int:
        """Remake every copy from its tensors as they are now; returns how many."""
        remade = 0
        for entry in list(self._entries.values()):
            tensors = [ref() for ref in entry[0]]
            n_weights = len(tensors) - (0 if entry[4] is None else (len(tensors) // 2))
            weights, biases = tensors[:n_weights], tensors[n_weights:]
            if all(t is not None for t in tensors) and entry[2].shape == _side_by_side_shape(weights):
                self._remake(entry, weights, biases)  # else remade on use
                remade += 1
        return remade

    def __len__(self) -> int:
        return len(self._entries)


def _side_by_side_shape(weights) -> Tuple[int, int]:
    """``(sum N_i, K)`` of weights taken as their rows."""
    rows = [weight_rows(w).shape for w in weights]
    return sum(r[0] for r in rows), rows[0][1]


WEIGHTS = dispatch.keep_input_copies(QuantizedWeights())


class LastActivation:
    """The e4m3 rows of the activation quantized last, for the next projection of the same tensor
    (q, k and v of one input: one quantization). Good while that tensor object is alive and keeps
    its address and version, and within one call of a compiled graph (a graph input edited
    through ``.data`` between calls keeps both); holds the tensor weakly."""

    def __init__(self):
        self._entry: Optional[tuple] = None

    def forget(self) -> None:
        self._entry = None

    def get(self, x: torch.Tensor, quantize=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x``'s rows quantized: the last ones where ``x`` is the tensor quantized last, else by
        ``quantize`` (a bound :func:`quantize_rows`) or :func:`quantize_rows`."""
        entry = self._entry
        if entry is not None and entry[0]() is x and entry[1] == _state(x):
            return entry[2], entry[3]
        q, scale = (quantize or quantize_rows)(x.view(-1, x.shape[-1]))
        try:
            self._entry = (weakref.ref(x), _state(x), q, scale)
        except TypeError:
            self._entry = None
        return q, scale


ACTIVATIONS = dispatch.remember_within_a_call(LastActivation())


def supported_layout(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """A contiguous bf16 ``x`` of at least 2 dims and a 2-D weight of its dtype (unit column
    stride), K and N multiples of 16, K at most MAX_K; a 1-D bias of the dtype or none."""
    return (x.dim() >= 2 and weight.dim() == 2 and x.dtype in DTYPES and weight.dtype == x.dtype
            and x.shape[-1] == weight.shape[1] and x.shape[-1] % ALIGN == 0 and weight.shape[0] % ALIGN == 0
            and 0 < x.shape[-1] <= MAX_K and x.numel() > 0
            and x.is_contiguous() and weight.stride(1) == 1
            and (bias is None or (bias.dim() == 1 and bias.dtype == x.dtype and bias.shape[0] == weight.shape[0])))


def linear_fp8(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    return bind(x, weight, bias)(x, weight, bias)


FIRST_SIGHT = tuning.FirstSight("linear_fp8")


def bind(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """:func:`linear_fp8` for inputs of this signature: the activation's quantization bound to
    its geometry. On the GPU, chosen at the signature's first sight against the unquantized
    GEMM the tier below runs (:func:`linear_bf16`), timed with the activation's quantization
    (as a projection whose input no sibling quantized pays it), and kept only where faster:
    small GEMMs (a text stream's few hundred rows, an adaLN projection) stay bf16."""
    k = x.shape[-1]
    quantize = _quantizer(x.numel() // k, k)

    def launch(x, weight, bias):
        return gemm_of_rows(*ACTIVATIONS.get(x, quantize), weight, bias, x.dtype)

    if not x.is_cuda:
        return launch

    def quantized(x, weight, bias):  # what first sight times: the activation quantized on each call
        return gemm_of_rows(*quantize(x.view(-1, k)), weight, bias, x.dtype)

    key = (tuple(x.shape), x.device, tuple(weight.shape), bias is not None)
    label, _ = FIRST_SIGHT.choose(key, (("bf16", linear_bf16), ("fp8", quantized)), (x, weight, bias))
    return launch if label == "fp8" else linear_bf16


def siblings_supported_layout(x: torch.Tensor, weights, biases) -> bool:
    """Each projection as :func:`supported_layout` takes it: a bias each, or none."""
    return (len(weights) > 0 and len(biases) in (0, len(weights))
            and all(supported_layout(x, w, biases[i] if biases else None) for i, w in enumerate(weights)))


def linear_fp8_siblings(x: torch.Tensor, weights, biases) -> torch.Tensor:
    """Launch; the caller has checked :func:`siblings_supported_layout` and the device."""
    return siblings_bind(x, weights, biases)(x, weights, biases)


SIBLINGS_FIRST_SIGHT = tuning.FirstSight("linear_fp8_siblings")


def siblings_bind(x: torch.Tensor, weights, biases):
    """:func:`linear_fp8_siblings` for inputs of this signature: ``x`` quantized once (or its rows
    quantized last, :data:`ACTIVATIONS`), one GEMM over the weights' copies side by side. On the
    GPU, chosen at first sight against the tier below's GEMMs (their outputs laid side by side),
    as :func:`bind` chooses."""
    k = x.shape[-1]
    quantize = _quantizer(x.numel() // k, k)

    def launch(x, weights, biases):
        return gemm_of_rows_side_by_side(*ACTIVATIONS.get(x, quantize), weights, biases, x.dtype)

    if not x.is_cuda:
        return launch

    def quantized(x, weights, biases):  # what first sight times: the activation quantized on each call
        return gemm_of_rows_side_by_side(*quantize(x.view(-1, k)), weights, biases, x.dtype)

    key = (tuple(x.shape), x.device, tuple(tuple(w.shape) for w in weights), bool(biases))
    label, _ = SIBLINGS_FIRST_SIGHT.choose(key, (("bf16", linears_bf16), ("fp8", quantized)), (x, weights, biases))
    return launch if label == "fp8" else linears_bf16


def linears_bf16(x: torch.Tensor, weights, biases) -> torch.Tensor:
    """The unquantized projections side by side (``[M, sum N_i]``)."""
    return torch.cat([linear_bf16(x, w, biases[i] if biases else None) for i, w in enumerate(weights)], 1)


def gemm_of_rows(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], dtype):
    """The row-wise scaled FP8 GEMM of quantized rows (e4m3 ``[M, K]``, fp32 ``[M, 1]`` scales)
    and the weight's kept e4m3 copy: ``[M, N]`` of ``dtype``."""
    wq, ws = WEIGHTS.get(weight)
    return _compat.scaled_mm(xq, wq.t(), xs, ws, bias, dtype, fast_accumulation=True)


def gemm_of_rows_side_by_side(xq: torch.Tensor, xs: torch.Tensor, weights, biases, dtype):
    """:func:`gemm_of_rows` over the weights' kept copies side by side (and their biases, or
    none): ``[M, sum N_i]`` of ``dtype``."""
    wq, ws, b = WEIGHTS.side_by_side(weights, biases)
    return _compat.scaled_mm(xq, wq.t(), xs, ws, b, dtype, fast_accumulation=True)


def linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The unquantized linear layer (``[M, N]``): on GPUs without FP8 GEMMs, and where the FP8
    GEMM is not faster (a pointwise convolution's weight taken as its rows)."""
    return torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), weight_rows(weight), bias)


def pointwise_supported_layout(x, weight, bias) -> bool:
    """A channels-last bf16 ``[B, C, H, W]`` map and a ``[N, C, 1, 1]`` weight the linear layer takes."""
    return (x.dim() == 4 and weight.dim() == 4 and tuple(weight.shape[2:]) == (1, 1) and weight.is_contiguous()
            and supported_layout(map_tokens(x), weight_rows(weight), bias))


def pointwise_bind(x, weight, bias):
    """:func:`pointwise_conv_fp8` for inputs of this signature."""
    linear = bind(map_tokens(x), weight_rows(weight), bias)

    def launch(x, weight, bias):
        return tokens_map(linear(map_tokens(x), weight, bias), x)

    return launch


def pointwise_conv_fp8(x, weight, bias):
    """Launch; the caller has checked :func:`pointwise_supported_layout` and the device."""
    return pointwise_bind(x, weight, bias)(x, weight, bias)


def pointwise_conv_bf16(x, weight, bias):
    """The unquantized convolution: on GPUs without FP8 GEMMs."""
    return torch.nn.functional.conv2d(x, weight, bias)


LINEAR_FP8 = Impl(run=linear_fp8, supports=supported_layout, bind=bind)
LINEAR_BF16 = Impl(run=linear_bf16)
LINEAR_FP8_SIBLINGS = Impl(run=linear_fp8_siblings, supports=siblings_supported_layout, bind=siblings_bind)
LINEAR_SIBLINGS_BF16 = Impl(run=linears_bf16)
POINTWISE_CONV_FP8 = Impl(run=pointwise_conv_fp8, supports=pointwise_supported_layout, bind=pointwise_bind)
POINTWISE_CONV_BF16 = Impl(run=pointwise_conv_bf16)
