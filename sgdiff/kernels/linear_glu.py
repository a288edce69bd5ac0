"""sgdiff::linear_glu — a projection and the SwiGLU of its two halves, in one GEMM.

Eager chain (diffusers' ``SwiGLU``: ``proj(x).chunk(2, -1)`` then ``hidden * silu(gate)``, gate
the second half — Mochi, HiDream, Ovis-Image, MiniMax-H3; ``Flux2SwiGLU``: ``silu(x1) * x2``,
gate the first half — Flux.2, Krea 2)::

    y = F.linear(x, weight, bias)               # [..., 2N]: cuBLAS's fp32 sums, one rounding
    first, second = y.chunk(2, dim=-1)
    out = silu(gate) * hidden                   # sgdiff::silu_mul's steps: SiLU rounded, product rounded

Each rounding is kept: sgdiff's GEMM computes cuBLAS's bits for both halves (one fp32
accumulator each, K in order: :mod:`sgdiff.kernels.linear`) and applies ATen's SiLU and product
to the rounded tiles in registers, so the ``[..., 2N]`` projection is never written. Tuned per
signature: where the fused GEMM is not faster than cuBLAS and sgdiff's silu_mul kernel, the
chain runs (the reference: cuBLAS and ATen's ops).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear import linear_reference
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.silu_mul import silu_mul_reference
from sgdiff.tiers import Contract


def linear_glu_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    gate_first: bool,
    wide_silu: bool = False,
) -> torch.Tensor:
    first, second = linear_reference(x, weight, bias).chunk(2, dim=-1)
    gate, hidden = (first, second) if gate_first else (second, first)
    return silu_mul_reference(gate, hidden, wide_silu)


def _swiglu(x, weight, bias, gate_first, wide_silu=False):
    """The models' own spelling: the projection, ``chunk``, SiLU and product."""
    def chain():
        first, second = F.linear(x, weight, bias).chunk(2, dim=-1)
        return F.silu(first) * second if gate_first else first * F.silu(second)
    return chain


def _projection(gate_first: bool, bias: bool):
    return lambda t: (t.randn(t.B, t.S, t.D), t.randn(2 * t.F, t.D, scale=t.D ** -0.5),
                      t.randn(2 * t.F) if bias else None, gate_first)


linear_glu = dispatch.define_op(OpDef(
    "linear_glu", Contract.BITEXACT, linear_glu_reference, impls=(triton("gemm"),),
    examples=(
        Example("Flux.2 feed-forward in (SwiGLU, gate first, no bias)", dict(B=1, S=4608, D=6144, F=18432),
                _projection(True, False), small=dict(S=64, D=64, F=64), chain=_swiglu),
        Example("SwiGLU feed-forward (gate second, bias)", dict(B=2, S=1024, D=2048, F=5632),
                _projection(False, True), small=dict(S=64, D=64, F=64), chain=_swiglu),
    ),
    tuned=True,
    doc="silu(gate) * hidden of the two halves of F.linear(x, weight, bias) (gate the first half with gate_first, "
        "else the second), every rounding kept: one GEMM with both halves' accumulators and the SwiGLU as its "
        "epilogue, or cuBLAS and the chain where that is faster",
))
