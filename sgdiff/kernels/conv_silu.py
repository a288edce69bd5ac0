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
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example, twice_out
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

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


def _sana_inverted(t):
    """Sana's block: tokens unflattened to a channels-last NCHW view, a 1x1 convolution's weights."""
    x = t.randn(t.B, t.H * t.W, t.C).unflatten(1, (t.H, t.W)).permute(0, 3, 1, 2)
    return x, t.randn(t.F, t.C, 1, 1, scale=t.C ** -0.5), t.randn(t.F), [1, 1], [0, 0], [1, 1], 1


def _own_epilogue(x, weight, bias, stride, padding, dilation, groups):
    """sgdiff's part alone: the bias + SiLU epilogue on a bias-free convolution's output."""
    from sgdiff.kernels.triton.silu_mul import bias_silu_bind

    y = convolution(x, weight, None, stride, padding, dilation, groups)
    epilogue = bias_silu_bind(y, bias)
    return lambda: epilogue(y, bias)  # in place


conv_silu = dispatch.define_op(OpDef(
    "conv_silu", Contract.BITEXACT, conv_silu_reference, impls=(triton("conv_silu"),),
    examples=(
        Example("Sana 1.6B conv_inverted + SiLU (conv included)", dict(B=2, H=32, W=32, C=2240, F=11200),
                _sana_inverted, small=dict(H=8, W=8, C=64, F=320), moved=twice_out, own_kernel=_own_epilogue,
                chain=lambda x, w, b, *geometry: lambda: F.silu(F.conv2d(x, w, b))),
    ),
    doc="silu(convolution(x, weight, bias, stride, padding, dilation, groups))",
))
