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


@torch.library.custom_op("sgdiff::layer_norm", mutates_args=())
def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
) -> torch.Tensor:
    return dispatch.run("layer_norm", x, weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    return layer_norm_reference(x, weight, bias, eps)
