"""sgdiff::biased_conv — a biased convolution whose input sgdiff writes channels-last.

Eager chain (a VAE decoder's upsampler ``conv`` after ``Upsample2D``'s interpolation, its
``conv_out`` after the last norm and SiLU)::

    y = convolution(x, weight, bias, ...)   # cuDNN: y = conv(x, w); y.add_(bias)

Not a pattern's op: :mod:`sgdiff.fxpasses.layouts` puts it where the op writing ``x`` writes it
channels-last (``conv_as_contiguous``), so that cuDNN runs without its transposes; the bias's
pass writes the output in eager's contiguous layout. The reference is the chain on a
contiguous ``x``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.examples import Example, twice_out
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract


def biased_conv_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    conv_as_contiguous: bool = False,
) -> torch.Tensor:
    if conv_as_contiguous:
        x = x.contiguous()
    return convolution(x, weight, bias, stride, padding, dilation, groups)


def _upsampler_conv(t):
    """An up block's upsampler convolution (3x3, padding 1) of a channels-last map."""
    x = t.randn(t.B, t.C, t.H, t.W).contiguous(memory_format=torch.channels_last)
    return x, t.randn(t.C, t.C, 3, 3, scale=(9 * t.C) ** -0.5), t.randn(t.C, scale=0.1), [1, 1], [1, 1], [1, 1], 1, True


def _eager_chain(x, weight, bias, stride, padding, dilation, groups, _):
    """Eager's convolution, of the contiguous map eager had."""
    contiguous = x.contiguous()
    return lambda: F.conv2d(contiguous, weight, bias, stride, padding, dilation, groups)


def _own_epilogue(x, weight, bias, stride, padding, dilation, groups, *rest):
    """sgdiff's part alone: the bias's pass over the bias-free convolution's output."""
    from sgdiff.kernels.triton.biased_conv import bind_epilogue

    y = convolution(x, weight, None, stride, padding, dilation, groups)
    epilogue = bind_epilogue(y, bias, *rest)
    return lambda: epilogue(y, bias, *rest)


biased_conv = dispatch.define_op(OpDef(
    "biased_conv", Contract.BITEXACT, biased_conv_reference, impls=(triton("biased_conv"),),
    examples=(
        Example("a VAE decoder's upsampler conv at Flux's last size, channels-last input (conv included)",
                dict(B=1, C=256, H=1024, W=1024), _upsampler_conv, small=dict(C=32, H=16, W=32), moved=twice_out,
                own_kernel=_own_epilogue, chain=_eager_chain),
    ),
    doc="convolution(x as contiguous, weight, bias, stride, padding, dilation, groups)",
))
