"""sgdiff::linear_fp8_siblings — linear layers of one input (q, k and v; Flux single blocks' q,
k, v and MLP projection) as one FP8 GEMM over their weights side by side (the ``high`` tier).

Eager chain it stands for, in bf16 (the biases all given or all absent)::

    y_i = x.view(-1, K) @ weight_i.T + bias_i    # [M, N_i], one GEMM each
    y = cat([y_0, y_1, ...], -1)                 # never made: each y_i is y's column slice

This op is :mod:`sgdiff.kernels.linear_fp8` of each projection, side by side: ``x``'s rows are
quantized once, the weights' rows (output channels) each scaled and quantized as linear_fp8's,
and one GEMM over the weights' e4m3 copies laid one after the other computes every projection
(per-row and per-channel scales make each output column exactly what its own linear_fp8 would
be, in fp32 math). What follows each projection reads its columns of ``y`` as a strided view
(:mod:`sgdiff.fxpasses.siblings` merges the ops). One GEMM of ``sum N_i`` columns fills the GPU
better than several of ``N_i`` each and is launched once (Flux's four single-block projections:
442 against 459 µs on an H100; Sana's q, k and v: 58 against 82). Contract ``approx``, as
linear_fp8's.
"""
from __future__ import annotations

from typing import List

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear_fp8 import fp8_impls, linear_fp8_reference
from sgdiff.kernels.registry import OpDef
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_fp8_siblings_reference(x: torch.Tensor, weights: List[torch.Tensor],
                                  biases: List[torch.Tensor]) -> torch.Tensor:
    """``[M, sum N_i]``: each weight's :func:`linear_fp8_reference` of ``x`` (rows ``M``: its
    leading dims flattened), side by side; ``biases`` one a weight, or empty."""
    if biases and len(biases) != len(weights):
        raise ValueError(f"{len(biases)} biases for {len(weights)} weights: one each, or none")
    outs = [linear_fp8_reference(x, w, biases[i] if biases else None) for i, w in enumerate(weights)]
    return aten.cat.default(outs, 1)


def _projections(t):
    """``x`` and its q, k and v projections of ``N`` channels each, then one of ``F`` (an MLP's)
    where ``F`` is not 0: ``(x, weights, biases)``."""
    widths = [t.N] * 3 + ([t.F] if t.F else [])
    weights = [t.randn(n, t.K, scale=t.K ** -0.5) for n in widths]
    return t.randn(t.M, t.K), weights, [t.randn(n, scale=0.1) for n in widths]


def _bf16_linears(x, weights, biases):
    """The eager chain: one cuBLAS bf16 GEMM a projection (their outputs are not concatenated)."""
    return lambda: [torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases)]


linear_fp8_siblings = dispatch.define_op(OpDef(
    "linear_fp8_siblings", Contract.APPROX, linear_fp8_siblings_reference,
    impls=fp8_impls("cublas", "LINEAR_SIBLINGS_BF16"),
    examples=(
        Example("Flux.1-dev single block, q, k, v and MLP projections", dict(M=4608, K=3072, N=3072, F=12288),
                _projections, small=dict(M=64, K=128, N=96, F=256), chain=_bf16_linears),
        Example("Flux.1-dev double block, image q, k, v", dict(M=4096, K=3072, N=3072, F=0), _projections,
                small=dict(M=64, K=128, N=64), chain=_bf16_linears),
        Example("Wan 2.1 1.3B self-attention q, k, v", dict(M=32760, K=1536, N=1536, F=0), _projections,
                small=dict(M=80, K=64, N=32), chain=_bf16_linears),
    ),
    doc="cat([linear_fp8(x, weight_i, bias_i) for each i], -1) as one FP8 GEMM: x's rows quantized once, the "
        "weights' e4m3 copies side by side (made once, kept), one launch",
    caches_inputs=True,
))
