"""Family ``residual_gate``: the gated residual update of a DiT block.

The eager chain (Flux, SD3, Sana, PixArt, QwenImage; Wan in fp32; Lumina with ``tanh``; gates
through a ``sigmoid``)::

    residual + gate * update

in every operand order, with ``gate`` a ``[B,1,D]`` chunk, ``gate.unsqueeze(1)``, a per-token
``[B,S,D]`` tensor, or ``tanh`` or ``sigmoid`` of one (before or after its views: the gate kind
is part of the variant's key, so a sigmoid gate is the op's and never an operand left eager); ``update`` may still carry
the ``aten.clone`` of an eval-mode Dropout, which the op makes unnecessary, and the ``+ bias``
that ATen adds after the ``bmm`` of a linear whose input is a strided 3-D view (Sana's linear
attention's output projection), which the op folds in. Mochi's bf16
``x + (rms_norm(y.float()) * tanh(gate)).to(x.dtype)`` casts the product before the sum, which
the op does in registers (``product_dtype``). Wan's
``(x.float() + y.float() * gate).type_as(x)`` the op takes in with its casts: it reads bf16
``x`` and ``y`` where widening them in registers gives eager's promoted dtypes
(:func:`folded_operands`), and writes the bf16 sum, so the fp32 copies never reach memory.

The residual is the block's token stream, ``[B, S, D]``, and never a product: a sum of two
products (``x * cos + x_rot * sin``, on ``[B, S, H, D]``) is a rotary embedding, and a
multiply-add of other ranks is no gated residual. Variants come from :class:`ResidualGateKey`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.kernels.residual_gate import GATE_FUNCTIONS, GATE_KINDS
from sgdiff.patterns.matcher import AnyOf, Arg, Lit, Match, Op, ReplayViews, Views
from sgdiff.patterns import parts
from sgdiff.patterns.base import (ChainPattern, Family, broadcast_reason, like_layout_reason, same_shape, tensor_meta)

aten = torch.ops.aten

# a per-token modulation, x * (1 + scale) + shift, is also a product added to a token stream
FAMILY = Family("residual_gate", after=("modulate",))


@dataclasses.dataclass(frozen=True)
class ResidualGateKey:
    gate: str  # "plain", or what the gate goes through first: "tanh", "sigmoid"
    bias: bool  # the update is ``update + bias``, a 1-D bias added after a linear's GEMM
    divisor: bool  # the update is divided by a number (``/ attn.rescale_output_factor``)

    @property
    def name(self) -> str:
        return ("residual_gate" + ("" if self.gate == "plain" else f"_{self.gate}") + ("_bias" if self.bias else "")
                + ("_div" if self.divisor else ""))

    @property
    def priority(self) -> int:  # the longer chain first, before a shorter one takes its root
        return 4 * self.divisor + 2 * self.bias + (self.gate != "plain")


def _divided(update):
    """``update / number``, maybe through an eval-mode Dropout's copy first."""
    divisor = Arg("update_divisor", check=parts.is_number)
    return AnyOf(Op(aten.div.Tensor, Op(aten.clone.default, update()), divisor),
                 Op(aten.div.Tensor, update(), divisor))


def _is_tensor(v) -> bool:
    return tensor_meta(v) is not None


def _update(key: ResidualGateKey):
    def update():
        if not key.bias:  # a number times the update is no gate but a scale (residual_add)
            return parts.maybe_upcast("update", check=_is_tensor) if not key.divisor else Arg("update")
        return Op(aten.add.Tensor, Arg("update", check=parts.is_multi_dim),
                  Arg("update_bias", check=parts.is_vector), alpha=Lit(1), commutative=True)

    return _divided(update) if key.divisor else update()


def _is_residual(v) -> bool:
    return parts.is_token_stream(v) and not parts.is_product(v)


def chain(key: ResidualGateKey):
    if key.gate != "plain":  # an elementwise function commutes with the views after it: replay them
        gate = Views(Op(GATE_FUNCTIONS[key.gate], Arg("gate"), shared=True), "gate_views")
    else:
        gate = parts.maybe_upcast("gate", check=_is_tensor)
    # a copied update first: either operand could be the Dropout's copy
    product = AnyOf(Op(aten.mul.Tensor, gate, Op(aten.clone.default, _update(key)), commutative=True),
                    Op(aten.mul.Tensor, gate, _update(key), commutative=True))
    # the product maybe cast before the sum: a bf16 update written from an fp32 one (Mochi's modulated RMSNorm)
    product = parts.maybe_cast(product, "product_cast")
    residual = parts.maybe_upcast("residual", check=_is_residual)
    return parts.out_cast(Op(aten.add.Tensor, residual, product, alpha=Lit(1), commutative=True))


FOLDABLE = ("residual", "gate", "update")


def folded_operands(m: Match) -> dict:
    """For each operand under a widening cast, whether the op may read the narrow tensor: it
    may where eager's promoted dtypes (update + bias, the product, the sum) stay what they
    are with the cast, as the kernel widens what it reads and computes in those dtypes. The
    largest operands are tried first: where two casts cannot both go, the small one stays."""
    dtypes = {name: tensor_meta(parts.operand(m, name, False)).dtype for name in FOLDABLE if m.get(name) is not None}
    want = _promoted(m, dtypes)
    folded = {}
    for name in sorted(dtypes, key=lambda n: -tensor_meta(m[n]).numel()):
        if parts.exact_upcast(m, name) is None:
            continue
        trial = dict(dtypes, **{name: tensor_meta(m[name]).dtype})
        if _promoted(m, trial) == want:
            dtypes, folded[name] = trial, True
    return folded


def _promoted(m: Match, dtypes: dict) -> tuple:
    promote = torch.promote_types
    bias = tensor_meta(m.get("update_bias"))
    updated = promote(dtypes["update"], bias.dtype) if bias is not None else dtypes["update"]
    product = promote(dtypes["gate"], updated) if "gate" in dtypes else updated
    # the update is rounded to its own dtype only where a bias or a divisor changes it
    rounded = updated if bias is not None or m.get("update_divisor") is not None else None
    cast = parts.cast_dtype(m, "product_cast")
    return rounded, product, cast, promote(dtypes["residual"], cast or product)


def replacement(key: ResidualGateKey):
    def args(m: Match):
        folded = folded_operands(m)
        residual, gate, update = (parts.operand(m, name, folded.get(name, False)) for name in FOLDABLE)
        if m.get("gate_views"):  # a tanh or sigmoid gate: its views replayed on the gate
            gate = ReplayViews(m["gate_views"], m["gate"])
        elif not key.bias and not key.divisor and _gate_is_the_update(m):
            gate, update = update, gate  # the same product; the op's gate is the conditioning
        # residual_layout=False only where eager's output is contiguous but the residual is not
        return dict(residual=residual, gate=gate, update=update, gate_kind=key.gate,
                    residual_layout=_layout_of_residual(m), update_bias=m.get("update_bias"),
                    update_divisor=m.get("update_divisor"), out_dtype=parts.cast_dtype(m, "out_cast"),
                    product_dtype=parts.cast_dtype(m, "product_cast"))

    return args


def _gate_is_the_update(m: Match) -> bool:
    """Whether the product's operand taken as the gate is the block's update: computed from the
    token stream (the residual), where the other is not. A plain gate and an update with no
    bias or divisor play the same part in the product (its promotion is symmetric), so either
    order computes eager's bits; the op takes the conditioning as its gate (a per-token gate
    can then be summed by the op, :mod:`sgdiff.fxpasses.addends`)."""
    residual = m["residual"]
    return (parts.depends_on(m["gate"], residual) and not parts.depends_on(m["update"], residual))


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


def _scaled():
    """``update * number`` (``number * update`` traces the same), maybe through an eval-mode
    Dropout's copy first."""
    scale = Arg("update_scale", check=parts.is_number)
    return AnyOf(Op(aten.mul.Tensor, Op(aten.clone.default, Arg("update")), scale),
                 Op(aten.mul.Tensor, Arg("update"), scale))


def residual_add_chain(scaled: bool):
    """``update / number + residual`` (Sana's and PixArt's cross-attention) or ``residual +
    number * update`` (ConsisID's face injection, an IP-Adapter's scaled attention), either order."""
    residual = Arg("residual", check=_is_residual)
    update = _scaled() if scaled else _divided(lambda: Arg("update"))
    return Op(aten.add.Tensor, update, residual, alpha=Lit(1), commutative=True)


def residual_add_args(m: Match):
    return dict(residual=m["residual"], update=m["update"], update_divisor=m.get("update_divisor"),
                update_first=m.root.args[1] is m["residual"], update_scale=m.get("update_scale"))


def patterns() -> List[ChainPattern]:
    keys = [ResidualGateKey(gate, bias, divisor) for gate in GATE_KINDS for bias in (True, False)
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
    ] + [ChainPattern(family="residual_gate", name="residual_" + name, chain=residual_add_chain(scaled),
                      op="residual_add", replacement=residual_add_args, check=check)
         for name, scaled in (("add", False), ("scaled", True))]
