"""Family ``conv_residual``: a biased convolution added to a residual, the sum maybe divided.

The eager chains::

    (residual + convolution(x, w, b)) / divisor    diffusers' ResnetBlock2D: ``(input_tensor +
                                                   conv2(h)) / output_scale_factor``
    convolution(x, w, b) + residual                Wan's VAE ResidualBlock: ``conv2(h) + shortcut``
                                                   -> conv_residual

where the convolution's output is read by the sum alone. ATen adds a cuDNN convolution's bias
in a pass of its own; the op adds it, the residual and the division in one.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, same_shape, tensor_meta
from sgdiff.patterns.matcher import Arg, Match, Op

# (a GroupNorm reading the sum takes the op's output instead: the families' order does not matter)
FAMILY = Family("conv_residual")

aten = torch.ops.aten


def _sum() -> Op:
    return Op(aten.add.Tensor, Arg("residual"), parts.biased_convolution(**parts.CONV_NAMES), name="sum",
              commutative=True)


def _reason(m: Match) -> Optional[str]:
    reason = parts.convolution_reason(m, "conv_x", "conv_weight", "conv_bias")
    if reason:
        return reason
    conv, residual, out = tensor_meta(m["conv"]), tensor_meta(m["residual"]), tensor_meta(m.root)
    if residual is None or out is None or not same_shape(residual.shape, conv.shape):
        return "the residual is broadcast against the convolution's output"
    if not residual.dtype == conv.dtype == out.dtype:
        return "the sum promotes"
    if len(m["sum"].kwargs) or len(m["sum"].args) != 2:
        return "a sum with alpha"
    return None


def _args(m: Match) -> dict:
    found = dict(parts.convolution_args(m), residual=m["residual"], conv_first=m["sum"].args[0] is m["conv"])
    if "divisor" in m:
        found["divisor"] = m["divisor"]
    return found


def patterns() -> List[ChainPattern]:
    return [
        ChainPattern(family="conv_residual", name="conv_residual_divided",
                     chain=Op(aten.div.Tensor, _sum(), Arg("divisor", check=parts.is_number)), op="conv_residual", replacement=_args,
                     check=_reason, priority=1),
        ChainPattern(family="conv_residual", name="conv_residual", chain=_sum(), op="conv_residual",
                     replacement=_args, check=_reason),
    ]
