"""Family ``activation``: the activation epilogues of feed-forward projections.

The eager chains::

    silu(a) * b                        gated (SwiGLU/GLU): Flux2 ``Flux2SwiGLU`` (two slices of one
                                       projection), Sana ``GLUMBConv`` (``x * silu(gate)`` of a
                                       chunk), LLaMA-style ``silu(w1(x)) * w3(x)``   -> silu_mul
    gelu(F.linear(x, w, b), "tanh")    diffusers ``GELU(approximate="tanh")`` after its
                                       projection (Flux, SD3, PixArt, Wan, QwenImage)
                                       -> linear_gelu_tanh, a ``close`` op (one fp32 pass)

``F.linear`` traces to ``view(x) -> addmm(b, ., t(w)) -> view`` (``mm`` without a bias).
Variants come from :class:`ActivationKey`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.fxpasses.matcher import AnyOf, Arg, Lit, Match, Op, Views
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, like_layout_reason, same_shape, same_size, tensor_meta

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ActivationKey:
    kind: str  # "silu_mul" | "linear_gelu_tanh"


def chain(key: ActivationKey):
    if key.kind == "silu_mul":
        return Op(aten.mul.Tensor, Op(aten.silu.default, Arg("a")), Arg("b"), commutative=True)
    x = Views(Arg("x"), "x_views")
    weight_t = Op(aten.t.default, Arg("weight"), shared=True)
    linear = AnyOf(Op(aten.addmm.default, Arg("bias"), x, weight_t, beta=Lit(1), alpha=Lit(1)),
                   Op(aten.mm.default, x, weight_t))
    return Op(aten.gelu.default, Views(linear, "out_views"), approximate=Lit("tanh"))


def replacement(key: ActivationKey):
    if key.kind == "silu_mul":
        return lambda m: (m["a"], m["b"])
    return lambda m: (m["x"], m["weight"], m.get("bias"))


def check(key: ActivationKey):
    operands_reason = _silu_mul_reason if key.kind == "silu_mul" else _linear_reason

    def activation_check(m: Match) -> Optional[str]:
        out = tensor_meta(m.root)
        if out is None or not out.dtype.is_floating_point:
            return "output is not a floating-point tensor"
        reason = operands_reason(m, out)
        if reason:
            return reason
        if key.kind == "silu_mul":  # elementwise: a's layout, like the chain
            return like_layout_reason(out, tensor_meta(m["a"]))
        return None if out.is_contiguous() else "the chain's output is not contiguous"

    return activation_check


def _silu_mul_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    for name in ("a", "b"):
        t = tensor_meta(m[name])
        if t is None or not same_shape(t.shape, out.shape):
            return f"{name} is broadcast: not a gated activation of two equal halves"
    return None


def _linear_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    x, weight = tensor_meta(m["x"]), tensor_meta(m["weight"])
    if x is None or weight is None or weight.dim() != 2 or x.dim() < 2 or not same_size(x.shape[-1], weight.shape[1]):
        return "not a linear layer (2-D weight over the input's last dim)"
    if any(v.target not in parts.RESHAPES for v in (*m["x_views"], *m["out_views"])):
        return "the linear's input or output is sliced or broadcast, not only reshaped"
    bias = m.get("bias")
    if bias is not None and (tensor_meta(bias) is None or tensor_meta(bias).dim() != 1):
        return "the bias is not a 1-D tensor"
    if not same_shape(out.shape, (*x.shape[:-1], weight.shape[0])):
        return "the GELU input is not the linear output reshaped back to the input's leading dims"
    return None


def patterns() -> List[ChainPattern]:
    return [
        ChainPattern(
            family="activation",
            name=kind,
            chain=chain(ActivationKey(kind)),
            op=kind,
            replacement=replacement(ActivationKey(kind)),
            check=check(ActivationKey(kind)),
        )
        for kind in ("silu_mul", "linear_gelu_tanh")
    ]
