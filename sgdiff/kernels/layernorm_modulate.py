"""sgdiff::layernorm_modulate — adaLN modulation of a LayerNorm over the last dim.

Eager chain (as diffusers writes it, e.g. Flux ``AdaLayerNormZero``, Sana, PixArt)::

    y = F.layer_norm(x, (D,), weight, bias, eps)    # rounded to x.dtype
    y = y * (1 + scale)                             # 1 + scale rounded to scale.dtype,
    y = y + shift                                   # each op rounded to its promoted dtype

``scale`` and ``shift`` are any tensors that broadcast to ``x`` ([B,1,D], [B,S,D], [D], ...);
``shift`` may be absent; with ``scale_plus_one=False`` the factor is ``scale`` itself.
``x_dtype``/``out_dtype``: ``x.to(x_dtype)`` is normalized and the result cast to
``out_dtype``, as in Wan's ``(norm(x.float()) * (1 + scale) + shift).type_as(x)``.
The reference implementation below *is* that chain, op for op, so it is bitwise equal to
eager on every device; accelerated implementations are checked against it.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layer_norm import layer_norm_reference
from sgdiff.kernels.layout import cast
from sgdiff.kernels.modulate import modulation


def layernorm_modulate_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
    scale_plus_one: bool = True,
    x_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    y = modulation(layer_norm_reference(x, weight, bias, eps, x_dtype), scale, shift, scale_plus_one)
    return cast(y, out_dtype)


layernorm_modulate = dispatch.define_op("layernorm_modulate", layernorm_modulate_reference)
