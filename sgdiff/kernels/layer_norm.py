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
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import cast
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

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


layer_norm = dispatch.define_op(OpDef(
    "layer_norm", Contract.BITEXACT, layer_norm_reference, impls=(triton("layer_norm"),),
    examples=(
        Example("q per head, affine (F.layer_norm over head_dim)", dict(B=1, S=4608, H=24, D=128),
                lambda t: (t.randn(t.B, t.S, t.H * t.D).unflatten(-1, (t.H, t.D)), t.randn(t.D), t.randn(t.D), 1e-6),
                small=dict(S=64, H=3), chain=lambda x, w, b, eps: lambda: F.layer_norm(x, x.shape[-1:], w, b, eps)),
        Example("Wan 2.1 1.3B cross-attention FP32LayerNorm, affine", dict(B=1, S=32760, D=1536),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D, dtype=torch.float32),
                           t.randn(t.D, dtype=torch.float32), 1e-6, torch.float32, torch.bfloat16),
                chain=lambda x, w, b, eps, *casts: lambda: F.layer_norm(x.float(), x.shape[-1:], w, b, eps).type_as(x)),
    ),
    doc="native_layer_norm(x.to(x_dtype)) over the last dim, cast to out_dtype",
))
