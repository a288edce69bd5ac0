"""sgdiff::layer_norm — a LayerNorm over the last dim (QK-norm over ``head_dim``).

Eager chain: ``F.layer_norm(x, (D,), weight, bias, eps)``, one ATen kernel
(``native_layer_norm``), rounded once to ``x``'s dtype; its output is contiguous whatever
``x``'s layout. The reference implementation is that call.

``x_dtype`` and ``out_dtype`` carry the casts around an fp32 LayerNorm, as diffusers'
``FP32LayerNorm`` and Wan's blocks write it: ``F.layer_norm(x.float(), ...).to(x.dtype)``
normalizes ``x.to(x_dtype)`` and casts the result to ``out_dtype``; a kernel reads and writes
the narrow tensors and keeps the fp32 ones in registers.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layout import cast

aten = torch.ops.aten


def layer_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    x_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    y = aten.native_layer_norm.default(cast(x, x_dtype), [x.shape[-1]], weight, bias, eps)[0].contiguous()
    return cast(y, out_dtype)


layer_norm = dispatch.define_op("layer_norm", layer_norm_reference)
