"""Family ``pad``: a constant pad of a concatenation, written in one pass.

The eager chain::

    constant_pad_nd(cat([a, b], dim), pad, value), the cat read by the pad alone   -> cat_pad
    constant_pad_nd(a, pad, value)                                               -> cat_pad (no b)

Video VAEs' causal 3-d convolutions spell it (diffusers' ``WanCausalConv3d``: the cached last
frames of the previous chunk put before the new ones along time, then ``F.pad`` on every side
before ``nn.Conv3d``): ATen copies both into the cat, fills the whole padded output and copies
the cat into it (and a pad alone: the fill, then the copy). The op is one copy. Sites need inputs of one floating dtype, up to 5 dims,
and a contiguous output.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import Arg, Items, Match, Op

FAMILY = Family("pad", after=("linear_attention",))  # its cast_copy takes Sana's pads of a cast

aten = torch.ops.aten
RANK = 5


def _reason(m: Match) -> Optional[str]:
    a, out = tensor_meta(m["a"]), tensor_meta(m.root)
    b = tensor_meta(m["b"]) if "b" in m else a
    if a is None or b is None or out is None:
        return "no tensor metadata"
    if not (a.dtype == b.dtype and a.dtype in parts.FLOATS and a.dim() == b.dim() <= RANK):
        return "not tensors of one dtype (float32, float16 or bfloat16), up to 5 dims"
    if not out.is_contiguous():
        return "the output not contiguous (the op writes a contiguous one)"
    if not (isinstance(m.get("dim", 0), int) and all(isinstance(p, int) for p in m["pad"])):
        return "a symbolic dim or pad"
    return None


def patterns() -> List[ChainPattern]:
    cat = Op(aten.cat.default, Items(Arg("a"), Arg("b")), Arg("dim"), name="cat")
    return [
        ChainPattern(family="pad", name="cat_pad", chain=Op(aten.constant_pad_nd.default, cat, Arg("pad"), Arg("value")),
                     op="cat_pad", replacement=lambda m: dict(a=m["a"], b=m["b"], dim=m["dim"], pad=list(m["pad"]),
                                                              value=m["value"]),
                     check=_reason, priority=1),
        ChainPattern(family="pad", name="pad", chain=Op(aten.constant_pad_nd.default, Arg("a"), Arg("pad"), Arg("value")),
                     op="cat_pad", replacement=lambda m: dict(a=m["a"], b=None, dim=0, pad=list(m["pad"]), value=m["value"]),
                     check=_reason),
    ]
