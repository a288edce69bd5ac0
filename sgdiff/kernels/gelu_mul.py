"""sgdiff::gelu_mul — the gated activation of a GeGLU feed-forward.

Eager chain (diffusers ``GEGLU``: ``hidden * F.gelu(gate)`` of a projection's two halves;
ERNIE-Image's ``up_proj(x) * F.gelu(gate_proj(x))``)::

    y = gelu(a)        # ATen's exact GELU in fp32, rounded to a.dtype
    y = y * b          # rounded to the promoted dtype

``a`` and ``b`` are the two operands as the product sees them. The output has ``a``'s layout
(:mod:`sgdiff.kernels.layout`), as the chain's. The reference implementation *is* that chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def gelu_mul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return in_layout_of(aten.mul.Tensor(aten.gelu.default(a), b), a)


gelu_mul = dispatch.define_op(OpDef(
    "gelu_mul", Contract.BITEXACT, gelu_mul_reference, impls=(triton("silu_mul"),),
    examples=(
        Example("ERNIE-Image feed-forward: up_proj(x) * gelu(gate_proj(x))", dict(B=1, S=4096, F=8192),
                lambda t: (t.randn(t.B, t.S, t.F, scale=3), t.randn(t.B, t.S, t.F)), small=dict(S=64, F=256),
                chain=lambda a, b: lambda: b * F.gelu(a)),
        Example("GEGLU halves of a projection", dict(B=2, S=4096, F=4608),
                lambda t: tuple(reversed(t.randn(t.B, t.S, 2 * t.F, scale=3).chunk(2, dim=-1))),
                small=dict(S=64, F=256), chain=lambda a, b: lambda: b * F.gelu(a)),
    ),
    doc="gelu(a) * b: ATen's exact GELU of a, rounded to a's dtype, times b",
))
