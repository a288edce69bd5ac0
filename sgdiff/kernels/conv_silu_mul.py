"""sgdiff::conv_silu_mul — a biased convolution and the gated SiLU of its two channel halves.

Eager chain (Sana ``GLUMBConv``: ``conv_depth`` (3x3 depthwise, biased), ``chunk(2, dim=1)``,
``x * silu(gate)``)::

    y = convolution(x, weight, bias, ...)   # cuDNN: y = conv(x, weight); y.add_(bias)
    a, gate = y.chunk(2, dim=1)
    out = a * silu(gate)                    # sgdiff::silu_mul(gate, a)

As for :mod:`sgdiff.kernels.conv_silu`, the bias can join the activation's pass where cuDNN
convolves. The output has ``gate``'s layout (channels-last for Sana). The reference
implementation *is* the chain.
"""
from __future__ import annotations


import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.silu_mul import silu_mul_reference


def conv_silu_mul_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    a, gate = torch.ops.aten.split.Tensor(convolution(x, weight, bias, stride, padding, dilation, groups),
                                          weight.shape[0] // 2, 1)
    return silu_mul_reference(gate, a)


conv_silu_mul = dispatch.define_op("conv_silu_mul", conv_silu_mul_reference)
