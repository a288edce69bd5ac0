"""sgdiff::conv_residual — a biased convolution added to a residual, the sum maybe divided.

Eager chain (diffusers' ``ResnetBlock2D``: ``(input_tensor + conv2(h)) / output_scale_factor``;
Wan's VAE ``ResidualBlock``: ``conv2(h) + shortcut(x)``)::

    y = convolution(x, conv_weight, conv_bias, ...)   # cuDNN: y = conv(x, w); y.add_(conv_bias)
    s = residual + y                                  # fp32 sum, rounded to the dtype
    s = s / divisor                                   # (a divisor given) ATen on CUDA:
                                                      # s * (1 / divisor), fp32, rounded

``conv_first`` keeps the eager operand order (``y + residual``). ``conv_as_contiguous``: ``x``
may arrive channels-last from an sgdiff op whose eager output was contiguous
(:mod:`sgdiff.fxpasses.layouts`); the op then computes what eager computed, the convolution of
a contiguous ``x``, as the reference does with a copy, and the kernel without one. Where ATen runs the convolution
on cuDNN its bias add is a pass of its own; a kernel can take the bias-free convolution and do
the bias, the sum and the division in one pass, with the same roundings. The reference
implementation *is* the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def conv_residual_reference(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    conv_groups: int,
    residual: torch.Tensor,
    divisor: Optional[float] = None,
    conv_first: bool = False,
    conv_as_contiguous: bool = False,
) -> torch.Tensor:
    if conv_as_contiguous:
        x = x.contiguous()
    y = convolution(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups)
    s = aten.add.Tensor(y, residual) if conv_first else aten.add.Tensor(residual, y)
    return s if divisor is None else aten.div.Tensor(s, divisor)


def _resnet_conv2(t):
    """A decoder ResNet block's ``conv2`` (3x3, padding 1) and the block's input, divided by 1.0."""
    return (t.randn(t.B, t.C, t.H, t.W), t.randn(t.C, t.C, 3, 3, scale=(9 * t.C) ** -0.5), t.randn(t.C, scale=0.1),
            [1, 1], [1, 1], [1, 1], 1, t.randn(t.B, t.C, t.H, t.W), 1.0, False)


def _wan_conv2(t):
    """Wan's VAE: a causal 3x3x3 convolution (its input already padded) plus the shortcut."""
    return (t.randn(t.B, t.C, t.T + 2, t.H + 2, t.W + 2), t.randn(t.C, t.C, 3, 3, 3, scale=(27 * t.C) ** -0.5),
            t.randn(t.C, scale=0.1), [1, 1, 1], [0, 0, 0], [1, 1, 1], 1, t.randn(t.B, t.C, t.T, t.H, t.W), None, True)


def _moved(args, out):
    """The convolution's output written and read back, the residual read, the sum written."""
    return [out, out, args[7], out]


def _own_epilogue(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, *rest):
    """sgdiff's part alone: the bias, sum and division on the bias-free convolution's output."""
    from sgdiff.kernels.triton.conv_residual import bind_epilogue

    y = convolution(x, conv_weight, None, stride, padding, dilation, conv_groups)
    epilogue = bind_epilogue(y, conv_bias, *rest)
    return lambda: epilogue(y, conv_bias, *rest)  # in place


conv_residual = dispatch.define_op(OpDef(
    "conv_residual", Contract.BITEXACT, conv_residual_reference, impls=(triton("conv_residual"),),
    examples=(
        Example("Flux VAE decoder, last up block: (x + conv2(h)) / 1.0 at 1024² (conv included)",
                dict(B=1, C=128, H=1024, W=1024), _resnet_conv2, small=dict(C=32, H=16, W=32), moved=_moved,
                own_kernel=_own_epilogue),
        Example("Wan 2.1 VAE decoder, 480p: conv2(h) + shortcut, 3-D (conv included)",
                dict(B=1, C=96, T=4, H=480, W=832), _wan_conv2, small=dict(C=16, T=2, H=8, W=16), moved=_moved,
                own_kernel=_own_epilogue),
    ),
    doc="(residual + convolution(x, conv_weight, conv_bias, ...)) [/ divisor]",
))
