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

aten = torch.ops.aten


def modulate_reference(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
) -> torch.Tensor:
    y = aten.mul.Tensor(x, aten.add.Tensor(scale, 1))
    if shift is not None:
        y = aten.add.Tensor(y, shift)
    return y.contiguous()


modulate = dispatch.define_op("modulate", modulate_reference)
