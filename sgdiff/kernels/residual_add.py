"""sgdiff::residual_add — an ungated residual update whose update an attention processor
divided by ``attn.rescale_output_factor`` (Sana's and PixArt's cross-attention)::

    y = update / divisor        # ATen on CUDA: update * (1 / divisor), fp32, rounded to update.dtype
    y = y + residual            # fp32 sum, rounded to the promoted dtype

``update_first`` keeps the operand order of the eager spelling, which decides the output's
layout when the two layouts differ. The reference implementation *is* the chain.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch

aten = torch.ops.aten


def residual_add_reference(
    residual: torch.Tensor,
    update: torch.Tensor,
    update_divisor: float,
    update_first: bool,
) -> torch.Tensor:
    y = aten.div.Tensor(update, update_divisor)
    return aten.add.Tensor(y, residual) if update_first else aten.add.Tensor(residual, y)


residual_add = dispatch.define_op("residual_add", residual_add_reference)
