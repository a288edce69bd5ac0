"""sgdiff::residual_add — an ungated residual update whose update an attention processor
divided by ``attn.rescale_output_factor`` (Sana's and PixArt's cross-attention), or that a
model scales by a number (ConsisID's face injection ``x + local_face_scale * attn(...)``, an
IP-Adapter's ``x + scale * ip_hidden_states``)::

    y = update / divisor        # ATen on CUDA: update * (1 / divisor), fp32, rounded to update.dtype
    y = update * scale          # or: the number rounded to fp32, an fp32 product, rounded to update.dtype
    y = y + residual            # fp32 sum, rounded to the promoted dtype

``update_first`` keeps the operand order of the eager spelling, which decides the output's
layout when the two layouts differ. The reference implementation *is* the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def residual_add_reference(
    residual: torch.Tensor,
    update: torch.Tensor,
    update_divisor: Optional[float],
    update_first: bool,
    update_scale: Optional[float] = None,
) -> torch.Tensor:
    if (update_divisor is None) == (update_scale is None):
        raise ValueError("residual_add takes exactly one of update_divisor and update_scale")
    if update_divisor is not None:
        y = aten.div.Tensor(update, update_divisor)
    else:
        y = aten.mul.Tensor(update, update_scale)
    return aten.add.Tensor(y, residual) if update_first else aten.add.Tensor(residual, y)


residual_add = dispatch.define_op(OpDef(
    "residual_add", Contract.BITEXACT, residual_add_reference, impls=(triton("residual_gate"),),
    examples=(
        Example("Sana 1.6B cross-attention: attn / 1.0 + x", dict(B=2, S=1024, D=2240),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, t.S, t.D), 1.0, True)),
        Example("divisor 2, residual first", dict(B=2, S=1024, D=2240),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, t.S, t.D), 2.0, False), bench=False),
        Example("ConsisID face injection: x + 0.7 * attn", dict(B=2, S=17550, D=3072),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, t.S, t.D), None, False, 0.7)),
    ),
    doc="update / divisor + residual or update * scale + residual (either order), in eager's promoted dtype and "
        "layout",
))
