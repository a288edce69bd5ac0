"""Family ``modulate``: adaLN modulation of a (normalized) activation.

The eager chain, as diffusers writes it (Flux ``AdaLayerNormZero``, Sana, PixArt, SD3, Wan,
QwenImage; RMSNorm in LTX-Video, Lumina2, HiDream)::

    norm(x) * (1 + scale) + shift

in either operand order, with ``norm`` a LayerNorm (``layernorm_modulate``), an RMSNorm in any
of its eager forms (``rmsnorm_modulate``) or absent (``modulate``); ``scale``/``shift`` as
``[B,1,D]`` chunks, ``scale[:, None]``, ``(1 + scale)[:, None, :]``, per-token ``[B,S,D]``; with or
without ``shift``. Around a LayerNorm chain in fp32, Wan's
``(norm(x.float()) * (1 + scale) + shift).type_as(x)``, the op takes the casts in: it reads the
bf16 ``x`` (widening it is exact) and writes the bf16 result, and the fp32 tensors between
never reach memory; so does ``layer_norm_cast``, diffusers' ``FP32LayerNorm`` without a
modulation (Wan's cross-attention norm). Variants come from :class:`ModulateKey`; a chain with
a norm is preferred to the bare modulation it contains.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.patterns.matcher import Arg, Lit, Match, Op, ReplayViews
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, broadcast_reason, same_shape, tensor_meta

aten = torch.ops.aten

FAMILY = Family("modulate")

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
    normed = {"layer_norm": lambda: parts.layer_norm(upcast=True), "rms_norm": lambda: parts.rms_norm(shared=True),
              "none": lambda: Arg("x")}[key.norm]()
    scaled = Op(aten.mul.Tensor, normed, parts.plus_one(), commutative=True)
    if key.shift:
        scaled = Op(aten.add.Tensor, scaled, Arg("shift"), alpha=Lit(1), commutative=True)
    return parts.out_cast(scaled) if key.norm == "layer_norm" else scaled


def _casts(m: Match):
    """(x as the op reads it, x_dtype, out_dtype) of a LayerNorm chain with Wan's casts."""
    x_dtype = parts.exact_upcast(m, "x")
    return parts.operand(m, "x", x_dtype is not None), x_dtype, parts.cast_dtype(m, "out_cast")


def _scale(m: Match):
    scale = m["scale"]
    return ReplayViews(m["scale_views"], scale) if m["scale_views"] else scale


def replacement(key: ModulateKey):
    if key.norm == "layer_norm":
        def args(m: Match):
            x, x_dtype, out_dtype = _casts(m)
            return dict(x=x, weight=m["weight"], bias=m["bias"], eps=m["eps"], scale=_scale(m), shift=m.get("shift"),
                        scale_plus_one=True, x_dtype=x_dtype, out_dtype=out_dtype)
        return args
    if key.norm == "rms_norm":
        return lambda m: dict(x=m["x"], weight=m.get("weight"), eps=m["eps"], form=parts.rms_norm_form(m)[0],
                              scale=_scale(m), shift=m.get("shift"))
    return lambda m: dict(x=m["x"], scale=_scale(m), shift=m.get("shift"))


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


def layer_norm_cast_chain():
    """``F.layer_norm(x.float(), ...).to(dtype)`` (diffusers' ``FP32LayerNorm``): the out cast
    is required, so a plain LayerNorm (ATen's kernel is as good) is never a site."""
    return parts.out_cast(parts.layer_norm(upcast=True), required=True)


def layer_norm_cast_args(m: Match):
    x, x_dtype, out_dtype = _casts(m)
    return dict(x=x, weight=m["weight"], bias=m["bias"], eps=m["eps"], x_dtype=x_dtype, out_dtype=out_dtype)


def layer_norm_cast_check(m: Match) -> Optional[str]:
    return parts.norm_chain_reason(m, parts.layer_norm_reason)


def patterns() -> List[ChainPattern]:
    out = [ChainPattern(family="modulate", name="layer_norm_cast", chain=layer_norm_cast_chain(), op="layer_norm",
                        replacement=layer_norm_cast_args, check=layer_norm_cast_check)]
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
