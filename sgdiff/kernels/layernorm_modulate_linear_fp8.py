"""sgdiff::layernorm_modulate_linear_fp8 — a LayerNorm-modulate read only by FP8 projections
(linear_fp8, or several side by side: linear_fp8_siblings), its rows made e4m3 in the pass that
computes them (the ``high`` tier).

Eager chain it stands for, in bf16 (the modulated input of a DiT block's attention or
feed-forward)::

    h = layer_norm(x.to(x_dtype), [D], weight, bias, eps) * (1 + scale) + shift   # .to(out_dtype)
    y_i = h.view(-1, D) @ weight_i.T + bias_i                                     # side by side

This op is :mod:`sgdiff.kernels.layernorm_modulate`'s ``h`` (each of eager's roundings kept),
then :mod:`sgdiff.kernels.linear_fp8_siblings` of it: its rows quantized to e4m3 as linear_fp8
quantizes rows, one GEMM over the weights' kept e4m3 copies. The kernel quantizes each row as it
normalizes and modulates it (:mod:`sgdiff.kernels.triton.layernorm_modulate_fp8`), so ``h`` is
never written in bf16 nor read back to be quantized. Its reference is that chain's math; the
rewrite is :mod:`sgdiff.fxpasses.fp8_rows`'s. Contract ``approx``, as linear_fp8's.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
from sgdiff.kernels.linear_fp8 import fp8_impls
from sgdiff.kernels.linear_fp8_siblings import linear_fp8_siblings_reference
from sgdiff.kernels.registry import OpDef
from sgdiff.tiers import Contract


def layernorm_modulate_linear_fp8_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
    scale_plus_one: bool,
    x_dtype: Optional[torch.dtype],
    out_dtype: Optional[torch.dtype],
    scale_addend: Optional[torch.Tensor],
    shift_addend: Optional[torch.Tensor],
    weights: List[torch.Tensor],
    biases: List[torch.Tensor],
) -> torch.Tensor:
    """``[M, sum N_i]`` (M: the LayerNorm-modulate's rows)."""
    h = layernorm_modulate_reference(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype,
                                     scale_addend, shift_addend)
    return linear_fp8_siblings_reference(h, weights, biases)


def _projections(t, widths):
    weights = [t.randn(n, t.D, scale=t.D ** -0.5) for n in widths]
    return weights, [t.randn(n, scale=0.1) for n in widths]


def _flux_single(t):
    """Flux.1-dev's single blocks: the chunked adaLN's scale and shift, q, k, v and the MLP's projection."""
    x = t.randn(t.B, t.S, t.D, scale=2, shift=0.5)
    scale, shift = t.modulation(t.B, t.S, t.D, "chunk")
    return (x, None, None, 1e-6, scale, shift, True, None, None, None, None,
            *_projections(t, (t.D, t.D, t.D, t.F)))


def _wan(t):
    """Wan 2.1's ``(norm1(x.float()) * (1 + scale) + shift).type_as(x)`` of its fp32 stream, its
    table's scale and shift, into the self-attention's q, k and v."""
    x = t.randn(t.B, t.S, t.D, dtype=torch.float32, scale=2, shift=0.5)
    scale, shift = t.modulation(t.B, t.S, t.D, "table", torch.float32)
    return (x, None, None, 1e-6, scale, shift, True, torch.float32, torch.bfloat16, None, None,
            *_projections(t, (t.D,) * 3))


def _chain(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend,
           weights, biases):
    """The eager chain: the LayerNorm-modulate, then cuBLAS's bf16 GEMMs."""
    def run():
        h = layernorm_modulate_reference(x, weight, bias, eps, scale, shift, scale_plus_one, x_dtype, out_dtype)
        return [torch.nn.functional.linear(h, w, b) for w, b in zip(weights, biases)]

    return run


layernorm_modulate_linear_fp8 = dispatch.define_op(OpDef(
    "layernorm_modulate_linear_fp8", Contract.APPROX, layernorm_modulate_linear_fp8_reference,
    # x bf16, or an fp32 stream normalized in fp32 and cast to bf16 (Wan's); elsewhere on the GPU, the two ops
    impls=fp8_impls("unfused", "LAYERNORM_MODULATE_THEN_LINEARS", module="layernorm_modulate_fp8",
                    dtypes=frozenset({"bfloat16", "float32"})),
    examples=(
        Example("Flux.1-dev single block: norm, then q, k, v and the MLP's projection",
                dict(B=1, S=4608, D=3072, F=12288), _flux_single, small=dict(B=1, S=8, D=128, F=256), chain=_chain),
        Example("Wan 2.1 1.3B: norm1 of the fp32 stream, then q, k, v", dict(B=1, S=32760, D=1536), _wan,
                small=dict(B=1, S=8, D=64), chain=_chain),  # 8 rows: the interpreter runs a row a second
    ),
    addends=(("scale", "scale_addend"), ("shift", "shift_addend")),
    doc="linear_fp8_siblings(layernorm_modulate(x, ...), weights, biases) with the LayerNorm-modulate's rows "
        "quantized to e4m3 as it makes them (never written in bf16)",
    caches_inputs=True,
))
