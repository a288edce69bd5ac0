"""Family ``activation``: the activation epilogues of feed-forward projections.

The eager chains::

    silu(a) * b                        gated (SwiGLU/GLU): Flux2 ``Flux2SwiGLU`` (two slices of one
                                       projection), Sana ``GLUMBConv`` (``x * silu(gate)`` of a
                                       chunk), LLaMA-style ``silu(w1(x)) * w3(x)``, Lumina's
                                       ``FP32SiLU``: ``silu(a.float()).to(a.dtype) * b``  -> silu_mul
    gelu(a) * b                        GeGLU: diffusers ``GEGLU`` (``hidden * gelu(gate)``),
                                       ERNIE-Image's ``up(x) * gelu(gate(x))``  -> gelu_mul
    cat([head, gelu(x, "tanh")], -1)   Flux single blocks: attention output and MLP side by
                                       side before ``proj_out``      -> gelu_tanh_cat
    silu(conv(x, w, b))                Sana ``GLUMBConv.conv_inverted`` + SiLU  -> conv_silu
    act(conv(x, w, b)) of a 1x1 convolution of a channels-last map, act SiLU or GELU
                                       the same, as the GEMM over the map's tokens
                                       -> pointwise_conv_act, a ``close`` op (cuBLAS's sums,
                                       not cuDNN's); conv_silu where the tier does not admit it
    a * silu(gate) of conv(x, w, b).chunk(2, 1)
                                       Sana ``GLUMBConv.conv_depth`` + its GLU  -> conv_silu_mul
                                       (both: the bias, which ATen adds after cuDNN's
                                       convolution, joins the activation's pass)
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

from sgdiff.patterns.matcher import AnyOf, Arg, Items, Lit, Match, Op, Views, When, getitem
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, like_layout_reason, same_shape, same_size, tensor_meta

FAMILY = Family("activation", after=("fp8_gemm",))  # at high, the FP8 GEMM takes the feed-forward's linear

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ActivationKey:
    kind: str  # one of KINDS

    @property
    def priority(self) -> int:  # the cat takes its GELU before linear_gelu_tanh (close) can, and
        if self.kind == "pointwise_conv_act":  # a conv its GLU; where the tier admits it, the
            return 2  # 1x1 convolution's GEMM before conv_silu
        return 1 if self.kind in ("gelu_tanh_cat", "conv_silu", "conv_silu_mul") else 0


KINDS = ("silu_mul", "gelu_mul", "gelu_tanh_cat", "conv_silu", "conv_silu_mul", "linear_gelu_tanh",
         "pointwise_conv_act")


def chain(key: ActivationKey):
    if key.kind == "silu_mul":  # the SiLU maybe of a.float(), cast back (FP32SiLU)
        silu = parts.maybe_cast(Op(aten.silu.default, parts.maybe_upcast("a")), "silu_back")
        return Op(aten.mul.Tensor, silu, Arg("b"), commutative=True)
    if key.kind == "gelu_mul":
        return Op(aten.mul.Tensor, Op(aten.gelu.default, Arg("a"), approximate=Lit("none")), Arg("b"),
                  commutative=True)
    if key.kind == "gelu_tanh_cat":
        gelu = Op(aten.gelu.default, Arg("x"), approximate=Lit("tanh"))
        return Op(aten.cat.default, Items(Arg("head"), gelu), Arg("dim"))
    if key.kind == "conv_silu":
        return Op(aten.silu.default, parts.biased_convolution())
    if key.kind == "pointwise_conv_act":
        conv = When(parts.biased_convolution(), parts.pointwise_convolution)
        return AnyOf(Op(aten.silu.default, conv), Op(aten.gelu.default, conv, approximate=Arg("approximate")))
    if key.kind == "conv_silu_mul":  # chunk(2, dim=1) traces to split(y, C // 2, 1)
        halves = Op(aten.split.Tensor, parts.biased_convolution(), Arg("split_size"), Lit(1), name="split")
        return Op(aten.mul.Tensor, getitem(halves, 0), Op(aten.silu.default, getitem(halves, 1, name="gate")),
                  commutative=True)
    x = Views(Arg("x"), "x_views")
    weight_t = Op(aten.t.default, Arg("weight"), shared=True)
    linear = AnyOf(Op(aten.addmm.default, Arg("bias"), x, weight_t, beta=Lit(1), alpha=Lit(1)),
                   Op(aten.mm.default, x, weight_t))
    return Op(aten.gelu.default, Views(linear, "out_views"), approximate=Lit("tanh"))


def replacement(key: ActivationKey):
    if key.kind == "silu_mul":
        return lambda m: dict(a=m["a"], b=m["b"], wide_silu="a_upcast" in m)
    if key.kind == "gelu_mul":
        return lambda m: dict(a=m["a"], b=m["b"])
    if key.kind == "gelu_tanh_cat":
        return lambda m: dict(head=m["head"], x=m["x"])
    if key.kind in ("conv_silu", "conv_silu_mul"):
        return lambda m: {name: m[name] for name in ("x", "weight", "bias", "stride", "padding", "dilation", "groups")}
    if key.kind == "pointwise_conv_act":
        return lambda m: dict(x=m["x"], weight=m["weight"], bias=m["bias"], act=_act_name(m))
    return lambda m: dict(x=m["x"], weight=m["weight"], bias=m.get("bias"))


def check(key: ActivationKey):
    operands_reason = {"silu_mul": _silu_mul_reason, "gelu_mul": _halves_reason, "gelu_tanh_cat": _cat_reason,
                       "conv_silu": _conv_reason, "conv_silu_mul": _conv_reason,
                       "pointwise_conv_act": _conv_reason}.get(key.kind, _linear_reason)

    def activation_check(m: Match) -> Optional[str]:
        out = tensor_meta(m.root)
        if out is None or not out.dtype.is_floating_point:
            return "output is not a floating-point tensor"
        reason = operands_reason(m, out)
        if reason:
            return reason
        if key.kind in ("silu_mul", "gelu_mul"):  # elementwise: a's layout, like the chain
            return like_layout_reason(out, tensor_meta(m["a"]))
        if key.kind in ("conv_silu", "pointwise_conv_act"):  # the activation in the convolution's layout
            return like_layout_reason(out, tensor_meta(m["conv"]))
        if key.kind == "conv_silu_mul":
            return like_layout_reason(out, tensor_meta(m["gate"]))
        return None if out.is_contiguous() else "the chain's output is not contiguous"

    return activation_check


def _silu_mul_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    a, back = tensor_meta(m["a"]), parts.cast_dtype(m, "silu_back")
    if "a_upcast" in m:  # FP32SiLU: a half-precision a widened, its SiLU rounded back to a's dtype
        if a is None or a.dtype not in parts.HALF or back != a.dtype \
                or m["a_upcast"].kwargs.get("dtype") != torch.float32:
            return "the SiLU of a widened a is not cast back to a's dtype"
    elif back is not None:
        return "the SiLU is cast to another dtype"
    return _halves_reason(m, out)


def _halves_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    for name in ("a", "b"):
        t = tensor_meta(m[name])
        if t is None or not same_shape(t.shape, out.shape):
            return f"{name} is broadcast: not a gated activation of two equal halves"
    return None


def _cat_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    head, x = tensor_meta(m["head"]), tensor_meta(m["x"])
    if head is None or x is None or head.dim() != x.dim() or not same_shape(head.shape[:-1], x.shape[:-1]):
        return "the cat's inputs do not share their leading dims"
    if not isinstance(m["dim"], int) or m["dim"] not in (-1, x.dim() - 1):
        return "the cat is not along the last dim"
    if not head.dtype == x.dtype == out.dtype:
        return "the cat mixes dtypes (it would promote)"
    return None


def _conv_reason(m: Match, out: torch.Tensor) -> Optional[str]:
    reason = parts.convolution_reason(m)
    if reason:
        return reason
    if tensor_meta(m["x"]).dim() != 4:
        return "a 3-D convolution (the activation kernels take 2-D ones)"
    if "split_size" in m and not (isinstance(m["split_size"], int)
                                  and 2 * m["split_size"] == tensor_meta(m["weight"]).shape[0]):
        return "the convolution's channels are not split in two halves"
    return None


def _act_name(m: Match) -> str:
    """The activation of a matched ``pointwise_conv_act``, as :mod:`sgdiff.kernels.linear_act` names it."""
    if m.root.target is aten.silu.default:
        return "silu"
    return "gelu_tanh" if m.get("approximate", "none") == "tanh" else "gelu"


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
            priority=ActivationKey(kind).priority,
        )
        for kind in KINDS
    ]
