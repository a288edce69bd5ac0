"""sgdiff::conv_group_norm — a biased convolution, the GroupNorm of its output, and the SiLU
after it where there is one.

Eager chain (the VAE decoders' ResNet blocks: ``conv1`` then ``norm2`` and ``nn.SiLU``)::

    y = convolution(x, conv_weight, conv_bias, ...)   # cuDNN: y = conv(x, w); y.add_(conv_bias)
    y = F.group_norm(y, G, weight, bias, eps)         # as sgdiff::group_norm
    y = F.silu(y)                                     # (silu=True)

Where ATen runs the convolution on cuDNN it adds the bias in a pass of its own (an fp32 sum
rounded to ``y.dtype``); the norm's kernels can take the bias-free convolution and add the bias
as they read it, with the same rounding, so the biased map is never written or read back. The
reference implementation *is* the chain. ``channels_last`` writes the output channels-last (as
sgdiff::group_norm's); ``conv_as_contiguous`` takes a channels-last ``x`` whose eager value was
contiguous (as sgdiff::conv_residual's).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.examples import Example, twice_out
from sgdiff.kernels.group_norm import group_norm_reference
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract


def conv_group_norm_reference(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    conv_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    groups: int,
    eps: float,
    silu: bool = False,
    channels_last: bool = False,
    conv_as_contiguous: bool = False,
) -> torch.Tensor:
    if conv_as_contiguous:
        x = x.contiguous()
    y = convolution(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups)
    return group_norm_reference(y, weight, bias, groups, eps, silu, channels_last)


def _resnet_conv1(t):
    """A decoder ResNet block's ``conv1`` (3x3, padding 1) and its ``norm2`` (32 groups)."""
    x = t.randn(t.B, t.C, t.H, t.W)
    return (x, t.randn(t.C, t.C, 3, 3, scale=(9 * t.C) ** -0.5), t.randn(t.C, scale=0.1), [1, 1], [1, 1], [1, 1], 1,
            t.randn(t.C, scale=0.5) + 1, t.randn(t.C, scale=0.1), 32, 1e-6, True)


def _own_epilogue(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, *norm):
    """sgdiff's part alone: the norm of the bias-free convolution's output, the bias added on read."""
    from sgdiff.kernels.triton.group_norm import _bind_pre_biased

    y = convolution(x, conv_weight, None, stride, padding, dilation, conv_groups)
    launch = _bind_pre_biased(y, conv_bias, *norm)
    return lambda: launch(y, conv_bias, *norm)


conv_group_norm = dispatch.define_op(OpDef(
    "conv_group_norm", Contract.BITEXACT, conv_group_norm_reference, impls=(triton("group_norm"),),
    examples=(
        Example("Flux VAE decoder, last up block: conv1 + GroupNorm + SiLU at 1024² (conv included)",
                dict(B=1, C=128, H=1024, W=1024), _resnet_conv1, small=dict(C=32, H=16, W=32), moved=twice_out,
                own_kernel=_own_epilogue,
                chain=lambda x, cw, cb, s, p, d, cg, w, b, g, eps, silu: lambda: F.silu(
                    F.group_norm(F.conv2d(x, cw, cb, s, p, d, cg), g, w, b, eps))),
    ),
    doc="silu?(group_norm(convolution(x, conv_weight, conv_bias, ...), groups, weight, bias, eps))",
))
