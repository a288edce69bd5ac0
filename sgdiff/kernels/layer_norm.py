"""sgdiff::layer_norm — a LayerNorm over the last dim (QK-norm over ``head_dim``).

Eager chain: ``F.layer_norm(x, (D,), weight, bias, eps)``, one ATen kernel
(``native_layer_norm``), rounded once to ``x``'s dtype; its output is contiguous whatever
``x``'s layout. The reference implementation is that call.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch

aten = torch.ops.aten


def layer_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
) -> torch.Tensor:
    return aten.native_layer_norm.default(x, [x.shape[-1]], weight, bias, eps)[0].contiguous()


layer_norm = dispatch.define_op("layer_norm", layer_norm_reference)
