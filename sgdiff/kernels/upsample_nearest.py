"""sgdiff::upsample_nearest — a nearest-neighbour upsampling by two of an [N, C, H, W] map.

Eager chain (diffusers' ``Upsample2D`` in VAE decoders' and UNets' up blocks:
``F.interpolate(x, scale_factor=2.0, mode="nearest")``, which traces to)::

    y = upsample_nearest2d(x, [2 H, 2 W], scales_h, scales_w)   # y[n, c, i, j] = x[n, c, i // 2, j // 2]

ATen's CUDA kernel takes ``floorf(i * 0.5)``, which is ``i // 2`` for every ``i``: the op is a pure
copy, bit-exact by construction. ``channels_last`` writes the same values channels-last, for
the convolution that reads them (:mod:`sgdiff.fxpasses.layouts`). The reference is the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import as_channels_last
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def upsample_nearest_reference(
    x: torch.Tensor,
    output_size: list[int],
    scales_h: Optional[float] = None,
    scales_w: Optional[float] = None,
    channels_last: bool = False,
) -> torch.Tensor:
    y = aten.upsample_nearest2d.default(x, list(output_size), scales_h, scales_w)
    return as_channels_last(y) if channels_last else y


def _up_block(t):
    """A decoder up block's upsampler: the block's output map, doubled."""
    return t.randn(t.B, t.C, t.H, t.W), [2 * t.H, 2 * t.W], 2.0, 2.0, bool(t.L)


upsample_nearest = dispatch.define_op(OpDef(
    "upsample_nearest", Contract.BITEXACT, upsample_nearest_reference, impls=(triton("upsample_nearest"),),
    examples=(
        Example("a VAE decoder's upsampler at Flux's third up block's size: 256² -> 512², 512 channels",
                dict(B=1, C=512, H=256, W=256, L=0),
                _up_block, small=dict(C=32, H=8, W=12)),
        Example("a VAE decoder's last upsampler at Flux's size, written channels-last for its convolution: "
                "512² -> 1024²",
                dict(B=1, C=256, H=512, W=512, L=1), _up_block, small=dict(C=96, H=6, W=10)),
    ),
    doc="upsample_nearest2d(x, output_size, scales_h, scales_w), output_size twice x's",
    tuned=True,  # both are copies: first sight keeps whichever is faster at the signature
))
