"""Triton sgdiff::conv_silu and sgdiff::conv_silu_mul, bitwise equal to eager on CUDA.

The convolution runs as eager runs it, on cuDNN, without its bias
(:mod:`sgdiff.kernels.triton.conv_bias`); the bias add (ATen's ``output.add_(bias)`` rounding)
and the activation then take one pass of the silu_mul kernel
(:mod:`sgdiff.kernels.triton.silu_mul`) instead of two or three. A depthwise convolution's
gated SiLU has a second way, the convolution summed in the same kernel as cuDNN sums it
(:mod:`sgdiff.kernels.triton.depthwise_conv`): conv_silu_mul is tuned, and first sight keeps
whichever of the two is faster where both give eager's bits.
"""
from __future__ import annotations

import functools

from sgdiff.kernels.conv_silu import conv_silu_reference
from sgdiff.kernels.conv_silu_mul import conv_silu_mul_reference
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import depthwise_conv
from sgdiff.kernels.triton.conv_bias import conv_epilogue_bind, on_cudnn, supported_conv
from sgdiff.kernels.triton.silu_mul import bias_silu_bind, bias_silu_mul_bind


def supported_layout(x, weight, bias, stride, padding, dilation, groups, halves: bool = False) -> bool:
    """Everything but the device and the backend: a biased 2-D convolution in one float dtype."""
    if not (x.dim() == 4 and supported_conv(x, weight, bias, stride, padding, dilation, groups)):
        return False
    return not halves or weight.shape[0] % 2 == 0


def can_use(x, weight, bias, stride, padding, dilation, groups, halves: bool = False) -> bool:
    return (x.is_cuda and supported_layout(x, weight, bias, stride, padding, dilation, groups, halves)
            and on_cudnn(x, weight, bias, stride, padding, dilation, groups))


def conv_silu_bind(*args):
    """:func:`conv_silu` for inputs of this signature."""
    return conv_epilogue_bind(conv_silu_reference, bias_silu_bind)


def conv_silu_mul_bind(*args):
    """:func:`conv_silu_mul` for inputs of this signature."""
    return conv_epilogue_bind(conv_silu_mul_reference, bias_silu_mul_bind)


def conv_silu(x, weight, bias, stride, padding, dilation, groups):
    """Launch; the caller has checked :func:`can_use`."""
    return conv_silu_bind()(x, weight, bias, stride, padding, dilation, groups)


def conv_silu_mul(x, weight, bias, stride, padding, dilation, groups):
    """Launch; the caller has checked :func:`can_use` with ``halves``."""
    return conv_silu_mul_bind()(x, weight, bias, stride, padding, dilation, groups)


def conv_silu_mul_variants(*args) -> list:
    """cuDNN's convolution and the epilogue kernel; for a depthwise convolution, also the
    convolution and the GLU in one kernel, in each of its tilings (first sight keeps the
    fastest of those that give eager's bits)."""
    found = [("cudnn + epilogue", conv_silu_mul_bind(*args))]
    if depthwise_conv.supported_layout(*args):
        found += depthwise_conv.variants(*args)
    return found


# (whether ATen would run the convolution on cuDNN needs the device: supports checks it)
CONV_SILU = Impl(run=conv_silu, supports=can_use, bind=conv_silu_bind)
CONV_SILU_MUL = Impl(run=conv_silu_mul, supports=functools.partial(can_use, halves=True), bind=conv_silu_mul_bind,
                     variants=conv_silu_mul_variants)
