"""sgdiff::conv_silu — a biased convolution and the SiLU after it.

Eager chain (Sana ``GLUMBConv``: ``conv_inverted`` (1x1, biased) then ``SiLU``)::

    y = convolution(x, weight, bias, ...)   # cuDNN: y = conv(x, weight); y.add_(bias)
    y = silu(y)                             # rounded to y.dtype

Where ATen runs the convolution on cuDNN it adds the bias in a separate pass (an fp32 sum
rounded to ``y.dtype``), so a kernel can take the bias-free convolution and add the bias and
apply the SiLU in one pass, with the same two roundings. The reference implementation *is* the
chain.
"""
from __future__ import annotations


import torch

from sgdiff.kernels import dispatch

aten = torch.ops.aten


def convolution(x: torch.Tensor, weight: torch.Tensor, bias, stride, padding, dilation, groups: int) -> torch.Tensor:
    """``aten.convolution`` of a plain (not transposed) convolution, as ``F.conv2d`` traces."""
    return aten.convolution.default(x, weight, bias, list(stride), list(padding), list(dilation), False,
                                    [0] * (x.dim() - 2), groups)


def conv_silu_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    return aten.silu.default(convolution(x, weight, bias, stride, padding, dilation, groups))


conv_silu = dispatch.define_op("conv_silu", conv_silu_reference)
