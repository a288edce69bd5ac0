"""Family ``modulate``: adaLN modulation of a normalized activation.

The eager chain, as diffusers writes it (Flux ``AdaLayerNormZero``, Sana, PixArt, SD3, Wan)::

    norm(x) * (1 + scale) + shift

in either operand order, with ``scale``/``shift`` as ``[B,1,D]`` chunks, ``scale[:, None]``,
``(1 + scale)[:, None, :]``, per-token ``[B,S,D]``, with or without ``shift``. Upcasts such as
Wan's ``(norm(x.float()) * (1 + scale) + shift).type_as(x)`` leave the casts around an fp32
chain, which matches like any other. Variants come from :class:`ModulateKey`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.fxpasses.matcher import Arg, Lit, Match, Op, ReplayViews
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, broadcast_reason, same_size, tensor_meta, val

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ModulateKey:
    norm: str  # "layer_norm"
    shift: bool  # "+ shift" present


def chain(key: ModulateKey):
    normed = parts.layer_norm()
    scaled = Op(aten.mul.Tensor, normed, parts.plus_one(), commutative=True)
    if not key.shift:
        return scaled
    return Op(aten.add.Tensor, scaled, Arg("shift"), alpha=Lit(1), commutative=True)


def replacement(m: Match):
    scale = m["scale"]
    if m["scale_views"]:
        scale = ReplayViews(m["scale_views"], scale)
    return (m["x"], m["weight"], m["bias"], m["eps"], scale, m.get("shift"), True)


def check(m: Match) -> Optional[str]:
    x = tensor_meta(m["x"])
    if x is None or not x.dtype.is_floating_point:
        return "input is not a floating-point tensor"
    shape = m["normalized_shape"]
    if not (isinstance(shape, (list, tuple)) and len(shape) == 1 and same_size(val(shape[0]), x.shape[-1])):
        return f"LayerNorm over {shape}, not over the last dim only"
    if not isinstance(m["eps"], float):
        return "eps is not a constant"
    for name in ("weight", "bias"):
        p = m[name]
        if p is not None and (tensor_meta(p) is None or tensor_meta(p).dim() != 1):
            return f"LayerNorm {name} is not a 1-D tensor"
    out = tensor_meta(m.root)
    if out is None or tuple(out.shape) != tuple(x.shape):
        return "the chain broadcasts the output beyond the input's shape"
    if not out.is_contiguous():
        return "the chain's output is not contiguous"
    for name in ("scale", "shift"):
        if m.get(name) is not None:
            reason = broadcast_reason(_param_after_views(m, name), x, name)
            if reason:
                return reason
    return None


def _param_after_views(m: Match, name: str):
    # the operand as the mul/add sees it: for the scale, the outermost replayed view
    if name == "scale" and m["scale_views"]:
        return m["scale_views"][0]
    return m[name]


def patterns() -> List[ChainPattern]:
    out = []
    for shift in (True, False):
        key = ModulateKey("layer_norm", shift)
        out.append(ChainPattern(
            family="modulate",
            name=f"layernorm_modulate{'' if shift else '_noshift'}",
            chain=chain(key),
            op="layernorm_modulate",
            replacement=replacement,
            check=check,
            priority=2 if shift else 1,
        ))
    return out
