"""sgdiff::conv_silu_mul — a biased convolution and the gated SiLU of its two channel halves.

Eager chain (Sana ``GLUMBConv``: ``conv_depth`` (3x3 depthwise, biased), ``chunk(2, dim=1)``,
``x * silu(gate)``)::

    y = convolution(x, weight, bias, ...)   # cuDNN: y = conv(x, weight); y.add_(bias)
    a, gate = y.chunk(2, dim=1)
    out = a * silu(gate)                    # sgdiff::silu_mul(gate, a)

As for :mod:`sgdiff.kernels.conv_silu`, the bias can join the activation's pass where cuDNN
convolves. The output has ``gate``'s layout (channels-last for Sana). The reference
implementation *is* the chain. A depthwise convolution (Sana's) can also be summed in the GLU's
kernel as cuDNN sums it: the op is tuned, and first sight keeps the fastest implementation that
gives eager's bits at the signature (the reference included).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.examples import Example, read_first
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.silu_mul import silu_mul_reference
from sgdiff.tiers import Contract


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


def _sana_depthwise(t):
    """Sana's GLUMBConv: the inverted convolution's SiLU output, a 3x3 depthwise convolution."""
    x = t.randn(t.B, t.H * t.W, t.C).unflatten(1, (t.H, t.W)).permute(0, 3, 1, 2)
    h = F.silu(convolution(x, t.randn(t.F, t.C, 1, 1, scale=t.C ** -0.5), t.randn(t.F),
                                      [1, 1], [0, 0], [1, 1], 1))
    return h, t.randn(t.F, 1, 3, 3, scale=1 / 3), t.randn(t.F), [1, 1], [1, 1], [1, 1], t.F


def _glu_chain(h, weight, bias, stride, padding, dilation, groups):
    def chain():
        a, gate = F.conv2d(h, weight, bias, padding=padding, groups=groups).chunk(2, dim=1)
        return a * F.silu(gate)

    return chain


def _own_epilogue(x, weight, bias, stride, padding, dilation, groups):
    """sgdiff's part alone: the bias + GLU epilogue on a bias-free convolution's output."""
    from sgdiff.kernels.triton.silu_mul import bias_silu_mul_bind

    y = convolution(x, weight, None, stride, padding, dilation, groups)
    epilogue = bias_silu_mul_bind(y, bias)
    return lambda: epilogue(y, bias)


conv_silu_mul = dispatch.define_op(OpDef(
    "conv_silu_mul", Contract.BITEXACT, conv_silu_mul_reference, impls=(triton("conv_silu"),),
    examples=(
        Example("Sana 1.6B conv_depth + GLU (conv included)", dict(B=2, H=32, W=32, C=2240, F=11200),
                _sana_depthwise, small=dict(H=8, W=8, C=64, F=320), moved=read_first, own_kernel=_own_epilogue,
                chain=_glu_chain),
    ),
    tuned=True,
    doc="a, gate = convolution(x, weight, bias, ...).chunk(2, dim=1); a * silu(gate)",
))
