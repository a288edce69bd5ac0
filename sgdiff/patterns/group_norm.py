"""Family ``group_norm``: GroupNorm, and the SiLU after it (VAE decoders and encoders).

The eager chains::

    native_group_norm(x, weight, bias, N, C, HxW, G, eps)[0]          -> group_norm
    silu(native_group_norm(...)[0]), the norm read by the SiLU alone  -> group_norm (silu=True)

``F.group_norm`` (``nn.GroupNorm``) traces to ``aten.native_group_norm`` of its input made
contiguous; diffusers' ``ResnetBlock2D`` follows it with ``nn.SiLU`` (its ``norm1`` and
``norm2``), its attention's ``group_norm`` and the decoder's ``conv_norm_out`` too.
A norm without an affine is not a site (ATen computes it by another formula).
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import fx

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import Arg, Match, Op, getitem

# on by default: bitwise equal to ATen's GroupNorm on the H200 (tests/gpu/test_group_norm_gpu.py) and
# a Flux VAE decode at 1024² in 0.6x eager's time (bench/results/small_models.md)
FAMILY = Family("group_norm")

aten = torch.ops.aten


def _norm() -> Op:
    return getitem(Op(aten.native_group_norm.default, Arg("x"), Arg("weight"), Arg("bias"), Arg("N"), Arg("C"),
                      Arg("HxW"), Arg("groups"), Arg("eps", check=parts.is_number), name="gn"), 0)


def _reason(m: Match) -> Optional[str]:
    x, out = tensor_meta(m["x"]), tensor_meta(m.root)
    if x is None or out is None or x.dim() < 3 or not x.dtype.is_floating_point:
        return "not a norm of a floating-point [N, C, *spatial] tensor"
    if not (isinstance(m["weight"], fx.Node) and isinstance(m["bias"], fx.Node)):
        return "a GroupNorm without its affine weight and bias"
    weight, bias = tensor_meta(m["weight"]), tensor_meta(m["bias"])
    if weight is None or bias is None or not weight.dtype == bias.dtype == x.dtype:
        return "the affine's dtype is not the input's"
    if not isinstance(m["groups"], int):
        return "a symbolic number of groups"
    return None


def patterns() -> List[ChainPattern]:
    args = lambda m: dict(x=m["x"], weight=m["weight"], bias=m["bias"], groups=m["groups"], eps=m["eps"])  # noqa: E731
    return [
        ChainPattern(family="group_norm", name="group_norm_silu", chain=Op(aten.silu.default, _norm()),
                     op="group_norm", replacement=lambda m: dict(args(m), silu=True), check=_reason, priority=1),
        ChainPattern(family="group_norm", name="group_norm", chain=_norm(), op="group_norm", replacement=args,
                     check=_reason),
    ]
