"""Family ``residual_gate``: the gated residual update of a DiT block.

The eager chain (Flux, SD3, Sana, PixArt, QwenImage; Wan in fp32; Lumina with ``tanh``)::

    residual + gate * update

in every operand order, with ``gate`` a ``[B,1,D]`` chunk, ``gate.unsqueeze(1)``, a per-token
``[B,S,D]`` tensor, or ``tanh`` of one (before or after its views); ``update`` may still carry
the ``aten.clone`` of an eval-mode Dropout, which the op makes unnecessary, and the ``+ bias``
that ATen adds after the ``bmm`` of a linear whose input is a strided 3-D view (Sana's linear
attention's output projection), which the op folds in. Wan's
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
    bias: bool  # the update is ``update + bias``, a 1-D bias added after a linear's GEMM
    divisor: bool  # the update is divided by a number (``/ attn.rescale_output_factor``)

    @property
    def name(self) -> str:
        return ("residual_gate" + ("_tanh" if self.tanh else "") + ("_bias" if self.bias else "")
                + ("_div" if self.divisor else ""))

    @property
    def priority(self) -> int:  # the longer chain first, before a shorter one takes its root
        return 4 * self.divisor + 2 * self.bias + self.tanh


def _divided(update):
    """``update / number``, maybe through an eval-mode Dropout's copy first."""
    divisor = Arg("update_divisor", check=parts.is_number)
    return AnyOf(Op(aten.div.Tensor, Op(aten.clone.default, update()), divisor),
                 Op(aten.div.Tensor, update(), divisor))


def _update(key: ResidualGateKey):
    def update():
        if not key.bias:
            return Arg("update")
        return Op(aten.add.Tensor, Arg("update", check=parts.is_multi_dim),
                  Arg("update_bias", check=parts.is_vector), alpha=Lit(1), commutative=True)

    return _divided(update) if key.divisor else update()


def chain(key: ResidualGateKey):
    if key.tanh:  # tanh commutes with the views between it and the product: replay them
        gate = Views(Op(aten.tanh.default, Arg("gate"), shared=True), "gate_views")
    else:
        gate = Arg("gate")
    # a copied update first: either operand could be the Dropout's copy
    product = AnyOf(Op(aten.mul.Tensor, gate, Op(aten.clone.default, _update(key)), commutative=True),
                    Op(aten.mul.Tensor, gate, _update(key), commutative=True))
    residual = Arg("residual", check=lambda v: parts.is_token_stream(v) and not parts.is_product(v))
    return Op(aten.add.Tensor, residual, product, alpha=Lit(1), commutative=True)


def replacement(key: ResidualGateKey):
    def gate(m: Match):
        views = m.get("gate_views")
        return ReplayViews(views, m["gate"]) if views else m["gate"]

    def args(m: Match):
        # residual_layout=False only where eager's output is contiguous but the residual is not
        if key.divisor:
            return (m["residual"], gate(m), m["update"], key.tanh, _layout_of_residual(m), m.get("update_bias"),
                    m["update_divisor"])
        if key.bias:
            return (m["residual"], gate(m), m["update"], key.tanh, _layout_of_residual(m), m["update_bias"])
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
    operands = [("update", m["update"])]
    if m.get("gate") is not None:
        operands.append(("gate", m["gate_views"][0] if m.get("gate_views") else m["gate"]))
    if m.get("update_bias") is not None:
        operands.append(("the update's bias", m["update_bias"]))
    for name, operand in operands:
        reason = broadcast_reason(operand, residual, name)
        if reason:
            return reason
    return None


def _layout_of_residual(m: Match) -> bool:
    # the layout eager gave the output (the check admits these two): the residual's, or contiguous
    return tensor_meta(m.root).is_contiguous() == tensor_meta(m["residual"]).is_contiguous()


def residual_add_chain():
    """``update / number + residual`` (Sana's and PixArt's cross-attention), either order."""
    residual = Arg("residual", check=lambda v: parts.is_token_stream(v) and not parts.is_product(v))
    return Op(aten.add.Tensor, _divided(lambda: Arg("update")), residual, alpha=Lit(1), commutative=True)


def residual_add_args(m: Match):
    return m["residual"], m["update"], m["update_divisor"], m.root.args[1] is m["residual"]


def patterns() -> List[ChainPattern]:
    keys = [ResidualGateKey(tanh, bias, divisor) for tanh in (True, False) for bias in (True, False)
            for divisor in (True, False)]
    return [
        ChainPattern(
            family="residual_gate",
            name=key.name,
            chain=chain(key),
            op="residual_gate",
            replacement=replacement(key),
            check=check,
            priority=key.priority,
        )
        for key in keys
    ] + [ChainPattern(family="residual_gate", name="residual_add", chain=residual_add_chain(), op="residual_add",
                      replacement=residual_add_args, check=check)]
