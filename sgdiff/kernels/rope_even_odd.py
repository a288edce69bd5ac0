"""sgdiff::rope_even_odd — rotary embedding written into even/odd slots (Wan).

Eager chain (diffusers ``WanAttnProcessor``), for ``x`` of shape [B, S, H, D]::

    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)      # x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin              # cos = freqs_cos[..., 0::2]
    out[..., 1::2] = x1 * sin + x2 * cos              # sin = freqs_sin[..., 1::2]
    out = out.type_as(x)                              # a no-op: out already has x's dtype

``cos``/``sin`` are the tables as the products see them. Rounding: each product, the difference
and the sum in the promoted dtype (bf16 products for bf16 tables), then the copy into ``out``
rounds to ``x.dtype``. The output has the layout of ``empty_like(x)``. The reference
implementation *is* that chain, op for op.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def rope_even_odd_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    x1, x2 = aten.unbind.int(aten.reshape.default(x, list(x.shape[:-1]) + [-1, 2]), -1)
    out = aten.empty_like.default(x)
    even = aten.sub.Tensor(aten.mul.Tensor(x1, cos), aten.mul.Tensor(x2, sin))
    aten.slice.Tensor(out, -1, 0, None, 2).copy_(even)
    odd = aten.add.Tensor(aten.mul.Tensor(x1, sin), aten.mul.Tensor(x2, cos))
    aten.slice.Tensor(out, -1, 1, None, 2).copy_(odd)
    return out


def _wan_chain(x, cos, sin):
    """WanAttnProcessor's ``apply_rotary_emb``: the tables' even and odd halves."""
    def chain():
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out.type_as(x)

    return chain


rope_even_odd = dispatch.define_op(OpDef(
    "rope_even_odd", Contract.BITEXACT, rope_even_odd_reference, impls=(triton("rope"),),
    examples=(
        Example("Wan 2.1 1.3B q, fp32 tables", dict(B=1, S=32760, H=12, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), t.randn(1, t.S, 1, t.D, dtype=torch.float32)[..., 0::2],
                           t.randn(1, t.S, 1, t.D, dtype=torch.float32)[..., 1::2]),
                small=dict(S=64, H=3), chain=_wan_chain),
    ),
    doc="out[..., 0::2] = x1 * cos - x2 * sin; out[..., 1::2] = x1 * sin + x2 * cos (Wan)",
))
