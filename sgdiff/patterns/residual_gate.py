"""Family ``residual_gate``: the gated residual update of a DiT block.

The eager chain (Flux, SD3, Sana, PixArt, QwenImage; Wan in fp32; Lumina with ``tanh``)::

    residual + gate * update

in every operand order, with ``gate`` a ``[B,1,D]`` chunk, ``gate.unsqueeze(1)``, a per-token
``[B,S,D]`` tensor, or ``tanh`` of one (before or after its views); ``update`` may still carry
the ``aten.clone`` of an eval-mode Dropout, which the op makes unnecessary. Wan's
``(x.float() + y * gate).type_as(x)`` leaves its casts around the fp32 chain.

The residual is the block's token stream, ``[B, S, D]``, and never a product: a sum of two
products (``x * cos + x_rot * sin``, on ``[B, S, H, D]``) is a rotary embedding, and a
multiply-add of other ranks is no gated residual. Variants come from :class:`ResidualGateKey`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.fxpasses.matcher import AnyOf, Arg, Lit, Match, Op, ReplayViews, Views
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, broadcast_reason, like_layout_reason, same_shape, tensor_meta

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ResidualGateKey:
    tanh: bool  # the gate goes through tanh first


def chain(key: ResidualGateKey):
    if key.tanh:  # tanh commutes with the views between it and the product: replay them
        gate = Views(Op(aten.tanh.default, Arg("gate"), shared=True), "gate_views")
    else:
        gate = Arg("gate")
    # a copied update first: either operand could be the Dropout's copy
    product = AnyOf(Op(aten.mul.Tensor, gate, Op(aten.clone.default, Arg("update")), commutative=True),
                    Op(aten.mul.Tensor, gate, Arg("update"), commutative=True))
    residual = Arg("residual", check=lambda v: parts.is_token_stream(v) and not parts.is_product(v))
    return Op(aten.add.Tensor, residual, product, alpha=Lit(1), commutative=True)


def replacement(key: ResidualGateKey):
    def gate(m: Match):
        views = m.get("gate_views")
        return ReplayViews(views, m["gate"]) if views else m["gate"]

    def args(m: Match):
        # residual_layout=False only where eager's output is contiguous but the residual is not
        layout = () if _layout_of_residual(m) else (False,)
        return (m["residual"], gate(m), m["update"], key.tanh) + layout

    return args


def check(m: Match) -> Optional[str]:
    residual = tensor_meta(m["residual"])
    if residual is None or not residual.dtype.is_floating_point:
        return "residual is not a floating-point tensor"
    out = tensor_meta(m.root)
    if out is None or not same_shape(out.shape, residual.shape):
        return "the chain broadcasts the output beyond the residual's shape"
    if not out.is_contiguous() and like_layout_reason(out, residual):
        return "the chain's output is neither contiguous nor in the residual's layout"
    gate = m["gate_views"][0] if m.get("gate_views") else m["gate"]
    for name, operand in (("gate", gate), ("update", m["update"])):
        reason = broadcast_reason(operand, residual, name)
        if reason:
            return reason
    return None


def _layout_of_residual(m: Match) -> bool:
    # the layout eager gave the output (the check admits these two): the residual's, or contiguous
    return tensor_meta(m.root).is_contiguous() == tensor_meta(m["residual"]).is_contiguous()


def patterns() -> List[ChainPattern]:
    return [
        ChainPattern(
            family="residual_gate",
            name="residual_gate" + ("_tanh" if key.tanh else ""),
            chain=chain(key),
            op="residual_gate",
            replacement=replacement(key),
            check=check,
            priority=1 if key.tanh else 0,
        )
        for key in (ResidualGateKey(tanh=True), ResidualGateKey(tanh=False))
    ]
