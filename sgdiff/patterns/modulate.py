"""Family ``modulate``: adaLN modulation of a (normalized) activation.

The eager chain, as diffusers writes it (Flux ``AdaLayerNormZero``, Sana, PixArt, SD3, Wan,
QwenImage; RMSNorm in LTX-Video, Lumina2, HiDream)::

    norm(x) * (1 + scale) + shift

in either operand order, with ``norm`` a LayerNorm (``layernorm_modulate``), an RMSNorm in any
of its eager forms (``rmsnorm_modulate``) or absent (``modulate``); ``scale``/``shift`` as
``[B,1,D]`` chunks, ``scale[:, None]``, ``(1 + scale)[:, None, :]``, per-token ``[B,S,D]``; with or
without ``shift``. Upcasts such as Wan's ``(norm(x.float()) * (1 + scale) + shift).type_as(x)``
leave the casts around an fp32 chain, which matches like any other. Variants come from
:class:`ModulateKey`; a chain with a norm is preferred to the bare modulation it contains.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.fxpasses.matcher import Arg, Lit, Match, Op, ReplayViews
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, broadcast_reason, same_shape, tensor_meta

aten = torch.ops.aten

NORMS = ("layer_norm", "rms_norm", "none")
OPS = {"layer_norm": "layernorm_modulate", "rms_norm": "rmsnorm_modulate", "none": "modulate"}


@dataclasses.dataclass(frozen=True)
class ModulateKey:
    norm: str  # one of NORMS
    shift: bool  # "+ shift" present

    @property
    def name(self) -> str:
        return OPS[self.norm] + ("" if self.shift else "_noshift")

    @property
    def priority(self) -> int:
        # a normalized chain before the bare modulation inside it, a shift before none
        return (0 if self.norm == "none" else 2) + (0 if self.shift else -1)


def chain(key: ModulateKey):
    normed = {"layer_norm": parts.layer_norm, "rms_norm": lambda: parts.rms_norm(shared=True),
              "none": lambda: Arg("x")}[key.norm]()
    scaled = Op(aten.mul.Tensor, normed, parts.plus_one(), commutative=True)
    if not key.shift:
        return scaled
    return Op(aten.add.Tensor, scaled, Arg("shift"), alpha=Lit(1), commutative=True)


def _scale(m: Match):
    scale = m["scale"]
    return ReplayViews(m["scale_views"], scale) if m["scale_views"] else scale


def replacement(key: ModulateKey):
    if key.norm == "layer_norm":
        return lambda m: (m["x"], m["weight"], m["bias"], m["eps"], _scale(m), m.get("shift"), True)
    if key.norm == "rms_norm":
        return lambda m: (m["x"], m.get("weight"), m["eps"], parts.rms_norm_form(m)[0], _scale(m), m.get("shift"))
    return lambda m: (m["x"], _scale(m), m.get("shift"))


def check(key: ModulateKey):
    norm_reason = {"layer_norm": parts.layer_norm_reason, "rms_norm": lambda m: parts.rms_norm_form(m)[1],
                   "none": lambda m: None}[key.norm]

    def modulate_check(m: Match) -> Optional[str]:
        reason = parts.norm_chain_reason(m, norm_reason)
        if reason:
            return reason
        x = tensor_meta(m["x"])
        out = tensor_meta(m.root)
        if out is None or not same_shape(out.shape, x.shape):
            return "the chain broadcasts the output beyond the input's shape"
        if not out.is_contiguous():
            return "the chain's output is not contiguous"
        for name in ("scale", "shift"):
            if m.get(name) is not None:
                reason = broadcast_reason(_param_after_views(m, name), x, name)
                if reason:
                    return reason
        return None

    return modulate_check


def _param_after_views(m: Match, name: str):
    # the operand as the mul/add sees it: for the scale, the outermost replayed view
    if name == "scale" and m["scale_views"]:
        return m["scale_views"][0]
    return m[name]


def patterns() -> List[ChainPattern]:
    out = []
    for norm in NORMS:
        for shift in (True, False):
            key = ModulateKey(norm, shift)
            out.append(ChainPattern(
                family="modulate",
                name=key.name,
                chain=chain(key),
                op=OPS[norm],
                replacement=replacement(key),
                check=check(key),
                priority=key.priority,
            ))
    return out
