"""sgdiff::pointwise_conv_fp8 — a 1x1 convolution over a channels-last map as an FP8 GEMM (the
``high`` tier): :mod:`sgdiff.kernels.linear_fp8` over the map's tokens.

Eager chain it stands for (Sana's GLUMBConv feed-forward: ``conv_inverted`` and ``conv_point``,
1x1 convolutions over ``[B, C, H, W]`` maps that are views of ``[B, H W, C]`` token streams)::

    y = F.conv2d(x, weight, bias)          # weight [N, C, 1, 1], stride 1, no padding, groups 1

A 1x1 convolution of a channels-last map is a linear layer over its tokens, ``tokens @ W.T +
bias``; this op computes that as ``linear_fp8`` does (each token and each output channel scaled
to e4m3, the product accumulated in fp32, one rounding) and returns the channels-last map
eager's convolution returns for a channels-last input. Contract ``approx``.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear_fp8 import fp8_impls, linear_fp8_reference
from sgdiff.kernels.registry import OpDef
from sgdiff.tiers import Contract


def pointwise_conv_fp8_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    b, c, h, w = x.shape
    y = linear_fp8_reference(x.permute(0, 2, 3, 1), weight.reshape(weight.shape[0], c), bias)
    return y.view(b, h, w, -1).permute(0, 3, 1, 2)


def _sana_map(t):
    """A ``[B, H W, C]`` token stream viewed as the channels-last map Sana's GLUMBConv convolves."""
    x = t.randn(t.B, t.H, t.W, t.C).permute(0, 3, 1, 2)
    return x, t.randn(t.N, t.C, 1, 1, scale=t.C ** -0.5), t.randn(t.N, scale=0.1)


def _bf16_conv(x, weight, bias):
    """The eager chain: the bf16 convolution (what the kernel bench times the op against)."""
    return lambda: torch.nn.functional.conv2d(x, weight, bias)


pointwise_conv_fp8 = dispatch.define_op(OpDef(
    "pointwise_conv_fp8", Contract.APPROX, pointwise_conv_fp8_reference,
    impls=fp8_impls("cudnn", "POINTWISE_CONV_BF16"),
    examples=(
        Example("Sana 1.6B GLUMBConv inverted 1x1, 1024², batch 2", dict(B=2, H=32, W=32, C=2240, N=11200),
                _sana_map, small=dict(H=4, W=8, C=64, N=96), chain=_bf16_conv),
        Example("Sana 1.6B GLUMBConv point 1x1", dict(B=2, H=32, W=32, C=5600, N=2240),
                _sana_map, small=dict(H=4, W=8, C=80, N=32), chain=_bf16_conv),
    ),
    doc="conv2d(x, weight [N, C, 1, 1], bias) of a channels-last map as linear_fp8 over its tokens (each token "
        "and each output channel scaled to e4m3, fp32 accumulation, one rounding to bf16); the channels-last "
        "output eager's convolution gives",
    caches_inputs=True,
))
