"""sgdiff::pointwise_conv_act — a biased 1x1 convolution of a channels-last map and the activation of
its output, as a linear layer over the map's tokens (the ``extra-high`` tier: a ``close`` op).

Eager chain it replaces (Sana's ``GLUMBConv``: ``conv_inverted``, a biased 1x1 convolution of the
token stream viewed as a channels-last ``[B, C, H, W]`` map, then ``SiLU``)::

    y = F.conv2d(x, weight, bias)          # weight [N, C, 1, 1]; cuDNN: y = conv(x, weight); y += bias
    y = act(y)                             # SiLU / GELU / GELU-tanh, rounded again

A 1x1 convolution of a channels-last map is the GEMM ``tokens @ weight.T`` over its ``[B H W, C]``
rows. This op may compute it as :mod:`sgdiff.kernels.linear_act` computes a linear layer and its
activation (cuBLAS's bits: fp32 sums, the bias added before one rounding; then ATen's activation
of the rounded product, or sgdiff's GEMM that applies it in its epilogue: the same bits), and
returns the channels-last map the convolution returns. cuDNN sums each output's C products in
another order than cuBLAS and rounds before it adds the bias, so the bits differ from eager's
(by about one bf16 rounding of the product); hence its contract ``close``. The reference is that
linear-layer math. On CUDA, first sight of a signature keeps the GEMM only where it is faster than
eager's convolution path (:mod:`sgdiff.kernels.conv_as_gemm`): at Sana 1.6B's shape the GEMM took
155.6 µs against cuDNN's 214.4 for the convolution alone (an H100;
``bench/results/runs/h100-2026-12-06-h.md``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import map_tokens, tokens_map, weight_rows
from sgdiff.kernels.linear_act import ACTIVATIONS, linear_act_reference
from sgdiff.kernels.registry import KernelSpec, OpDef
from sgdiff.tiers import Contract


def pointwise_conv_act_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    act: str,
) -> torch.Tensor:
    return tokens_map(linear_act_reference(map_tokens(x), weight_rows(weight), bias, act), x)


def _sana_map(t):
    """Sana's block: the ``[B, H W, C]`` token stream unflattened to a channels-last map."""
    x = t.randn(t.B, t.H * t.W, t.C).unflatten(1, (t.H, t.W)).permute(0, 3, 1, 2)
    return x, t.randn(t.F, t.C, 1, 1, scale=t.C ** -0.5), t.randn(t.F), "silu"


def _conv_chain(x, weight, bias, act):
    """The eager chain: cuDNN's convolution, then the activation."""
    return lambda: ACTIVATIONS[act](F.conv2d(x, weight, bias))


pointwise_conv_act = dispatch.define_op(OpDef(
    "pointwise_conv_act", Contract.CLOSE, pointwise_conv_act_reference,
    # eager's convolution path or the GEMM over the tokens, the faster at first sight
    impls=(KernelSpec("", "first_sight", None, "sgdiff.kernels.conv_as_gemm:POINTWISE_CONV_ACT",
                      devices=frozenset({"cuda"}), dtypes=frozenset({"float16", "bfloat16"}), priority=10),),
    examples=(
        Example("Sana 1.6B GLUMBConv conv_inverted + SiLU, 1024², batch 2", dict(B=2, H=32, W=32, C=2240, F=11200),
                _sana_map, small=dict(H=4, W=8, C=64, F=96), chain=_conv_chain),
    ),
    doc="act(conv2d(x, weight [N, C, 1, 1], bias)) of a channels-last map as act(linear) over its tokens "
        "(cuBLAS's sums and roundings, not cuDNN's: close), the channels-last map eager's convolution gives; "
        "on CUDA, eager's convolution path where first sight finds the GEMM no faster",
))
