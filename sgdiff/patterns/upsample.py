"""Family ``upsample``: a nearest-neighbour upsampling of a map by two.

The eager chain::

    upsample_nearest2d(x, [2 H, 2 W], scales_h, scales_w)   -> upsample_nearest

diffusers' ``Upsample2D`` (the VAE decoders' up blocks, UNets) spells it
``F.interpolate(x, scale_factor=2.0, mode="nearest")``, traced as ATen's kernel
(:func:`sgdiff._compat.eager_interpolation`). The op is the same copy; it can also write the map
channels-last for the convolution after it (:mod:`sgdiff.fxpasses.layouts`). Sites need a
contiguous 4-d floating map doubled in both dims, scales None or 2.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import Arg, Match, Op

FAMILY = Family("upsample")

aten = torch.ops.aten


def _reason(m: Match) -> Optional[str]:
    x, out = tensor_meta(m["x"]), tensor_meta(m.root)
    if x is None or out is None or x.dim() != 4 or x.dtype not in parts.FLOATS:
        return "not a floating-point [N, C, H, W] map"
    if not (x.is_contiguous() and out.is_contiguous()):
        return "not a contiguous map"
    size = m["output_size"]
    if not (isinstance(size, (list, tuple)) and all(isinstance(s, int) for s in size)
            and list(size) == [2 * x.shape[2], 2 * x.shape[3]]):
        return "not doubled in both dims (or a symbolic size)"
    if not all(s is None or s == 2.0 for s in (m["scales_h"], m["scales_w"])):
        return "scales other than 2"
    return None


def patterns() -> List[ChainPattern]:
    chain = Op(aten.upsample_nearest2d.default, Arg("x"), Arg("output_size"), Arg("scales_h"), Arg("scales_w"))
    return [
        ChainPattern(family="upsample", name="upsample_nearest", chain=chain, op="upsample_nearest",
                     replacement=lambda m: dict(x=m["x"], output_size=list(m["output_size"]),
                                                scales_h=m["scales_h"], scales_w=m["scales_w"]),
                     check=_reason),
    ]
