"""sgdiff::modulate — adaLN modulation of an activation that is not normalized first.

Eager chain::

    y = x * (1 + scale)     # 1 + scale rounded to scale.dtype, the product to the promoted dtype
    y = y + shift           # rounded to the promoted dtype; absent for scale-only chains

``scale`` and ``shift`` are any tensors that broadcast to ``x``. The reference implementation
*is* that chain, op for op; the output is contiguous.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def modulation(
    y: torch.Tensor,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
    scale_plus_one: bool = True,
) -> torch.Tensor:
    """``y * (1 + scale) [+ shift]`` (``y * scale`` without ``scale_plus_one``) as eager runs it,
    contiguous: the tail every modulate op's reference shares."""
    y = aten.mul.Tensor(y, aten.add.Tensor(scale, 1) if scale_plus_one else scale)
    if shift is not None:
        y = aten.add.Tensor(y, shift)
    return y.contiguous()


def summed(operand: Optional[torch.Tensor], addend: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``operand + addend`` as eager's add computes it (promoted, one rounding), or ``operand``
    where there is no addend: a modulation operand eager summed before its chain (an adaLN
    table and a per-token embedding), which an op takes as the two views it summed."""
    return operand if addend is None else aten.add.Tensor(operand, addend)


def modulate_reference(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
) -> torch.Tensor:
    return modulation(x, scale, shift)


modulate = dispatch.define_op(OpDef(
    "modulate", Contract.BITEXACT, modulate_reference, impls=(triton("modulate"),),
    examples=(
        Example("Sana 1.6B sized, table params", dict(B=2, S=1024, D=2240),
                lambda t: (t.randn(t.B, t.S, t.D), *t.modulation(t.B, t.S, t.D, "table"))),
        Example("Flux.1-dev sized, chunk params", dict(B=1, S=4608, D=3072),
                lambda t: (t.randn(t.B, t.S, t.D), *t.modulation(t.B, t.S, t.D, "chunk"))),
        Example("per token", dict(B=2, S=4096, D=1152),
                lambda t: (t.randn(t.B, t.S, t.D), *t.modulation(t.B, t.S, t.D, "per_token")), bench=False),
    ),
    doc="x * (1 + scale) + shift, no norm; shift optional",
))
