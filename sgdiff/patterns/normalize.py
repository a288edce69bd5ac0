"""Family ``normalize``: ``F.normalize`` over the channels, scaled, with a per-channel affine
(and the SiLU after it): the steps after the norm, as one op.

The eager chain (diffusers' ``WanRMS_norm``, channel-first: Wan's VAE)::

    xf = x.float()                       (absent for an fp32 x; may have other users: the norm)
    n  = linalg_vector_norm(xf, 2, [1], keepdim=True)          (ATen's; stays in the graph)
    d  = xf / clamp_min(n, eps).expand(xf.shape)
    y  = d.to(x.dtype) * scale * gamma + bias     (scale a number, gamma [C, 1, ...], bias a
                                                   number or [C, 1, ...])
                                                  (scale may be a graph input: a 0-d fp32 host
                                                   tensor, the product cast to x's dtype again)
    y  = silu(y)                                  (where the block has one)   -> channel_normalize
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import fx

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import AnyOf, Arg, Lit, Match, Op, bound_arguments

FAMILY = Family("normalize")

aten = torch.ops.aten
prims = torch.ops.prims


def _scale(v) -> bool:
    """A number, or a node: dynamo makes a module's float attribute an input of the graph once a
    frame's recompiles see it change (one block's code serving several widths)."""
    return parts.is_number(v) or isinstance(v, fx.Node)


def _chain(silu: bool):
    xf = parts.maybe_upcast("x")
    den = Op(aten.expand.default, Op(aten.clamp_min.default, Arg("norm"), Arg("eps", check=parts.is_number)),
             Arg("size"))
    normalized = parts.maybe_cast(Op(aten.div.Tensor, xf, den), "normalized")
    scaled = Op(aten.mul.Tensor, normalized, Arg("scale", check=_scale), name="scaled")
    scaled = AnyOf(Op(prims.convert_element_type.default, scaled, Arg("scaled_dtype"), name="scaled_cast"), scaled)
    y = Op(aten.add.Tensor, Op(aten.mul.Tensor, scaled, Arg("gamma", check=lambda g: isinstance(g, fx.Node)),
                               commutative=True),
           Arg("bias"), alpha=Lit(1))
    return Op(aten.silu.default, y) if silu else y


def _per_channel(t, x) -> bool:
    return (t is not None and t.dtype == x.dtype and t.numel() == x.shape[1] and 1 <= t.dim() <= x.dim() - 1
            and t.shape[0] == x.shape[1])


def _reason(m: Match) -> Optional[str]:
    x, out = tensor_meta(m["x"]), tensor_meta(m.root)
    if x is None or out is None or x.dtype not in parts.FLOATS or x.dim() < 3:
        return "not a float [N, C, *spatial] tensor"
    upcast, back = m.get("x_upcast"), parts.cast_dtype(m, "normalized")
    if x.dtype == torch.float32:
        if upcast is not None or back is not None:
            return "casts around an fp32 normalize"
    elif upcast is None or upcast.kwargs.get("dtype") != torch.float32 or back != x.dtype:
        return "not normalized in fp32 and cast back to the input's dtype"
    norm = m["norm"]
    args = bound_arguments(norm) if isinstance(norm, fx.Node) and norm.target == aten.linalg_vector_norm.default else None
    if not (args and args["self"] is (upcast if upcast is not None else m["x"]) and args["ord"] == 2
            and list(args["dim"] or ()) in ([1], [1 - x.dim()]) and args["keepdim"] and args["dtype"] is None):
        return "not the 2-norm of the same tensor over dim 1, kept"
    scale = m["scale"]
    if isinstance(scale, fx.Node):
        s, scaled = tensor_meta(scale), tensor_meta(m["scaled"])
        if not (s is not None and s.dim() == 0 and s.dtype == torch.float32 and s.device.type == "cpu"
                and scaled is not None and scaled.dtype == x.dtype):
            return "the scale is neither a number nor an fp32 number on the host"
    if m.get("scaled_cast") is not None and m["scaled_dtype"] != x.dtype:
        return "the scaled tensor is cast to another dtype"
    if not _per_channel(tensor_meta(m["gamma"]), x):
        return "gamma is not one value a channel in the input's dtype"
    bias = m["bias"]
    if not (parts.is_number(bias) or (isinstance(bias, fx.Node) and _per_channel(tensor_meta(bias), x))):
        return "the bias is neither a number nor one value a channel"
    if not (out.dtype == x.dtype and out.shape == x.shape
            and all(n == 1 or a == b for n, a, b in zip(x.shape, x.stride(), out.stride()))):
        return "the output is not laid out as the input (shape, strides and dtype)"
    return None


def _args(m: Match, silu: bool) -> dict:
    bias, scale = m["bias"], m["scale"]
    tensor_bias, tensor_scale = isinstance(bias, fx.Node), isinstance(scale, fx.Node)
    return dict(x=m["x"], norm=m["norm"], eps=m["eps"], scale=1.0 if tensor_scale else scale, gamma=m["gamma"],
                bias=bias if tensor_bias else None, bias_value=0.0 if tensor_bias else float(bias), silu=silu,
                scale_tensor=scale if tensor_scale else None)


def patterns() -> List[ChainPattern]:
    return [
        ChainPattern(family="normalize", name="channel_normalize_silu", chain=_chain(True), op="channel_normalize",
                     replacement=lambda m: _args(m, True), check=_reason, priority=1),
        ChainPattern(family="normalize", name="channel_normalize", chain=_chain(False), op="channel_normalize",
                     replacement=lambda m: _args(m, False), check=_reason),
    ]
