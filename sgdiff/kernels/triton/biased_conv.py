"""Triton sgdiff::biased_conv: cuDNN's bias-free convolution of the channels-last ``x``, then the
bias's pass (:mod:`sgdiff.kernels.triton.strided_epilogue`) writing eager's contiguous output."""
from __future__ import annotations

from sgdiff.kernels.biased_conv import biased_conv_reference
from sgdiff.kernels.layout import channels_last_strides, contiguous_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import strided_epilogue
from sgdiff.kernels.triton.conv_bias import conv_epilogue_bind, conv_output_shape, on_cudnn


def supported_layout(x, weight, bias, stride, padding, dilation, groups, conv_as_contiguous=False) -> bool:
    """Everything but the device and the backend: a biased 2-D or 3-D convolution of a contiguous
    weight and a channels-last ``x`` taken as a contiguous one."""
    shape = conv_output_shape(x, weight, bias, stride, padding, dilation, groups, conv_as_contiguous)
    return (shape is not None and not x.is_contiguous()
            and strided_epilogue.fits(shape, channels_last_strides(shape), contiguous_strides(shape)))


def can_use(*args) -> bool:
    return args[0].is_cuda and supported_layout(*args) and on_cudnn(*args[:7])


def bind_epilogue(y, bias, conv_as_contiguous=False):
    """The bias's pass over the bias-free output ``y``: ``epilogue(y, bias, ...)``."""
    epilogue = strided_epilogue.bind(y, None, None, strided_epilogue.eager_strides(y.shape, None))
    return lambda y, bias, *_: epilogue(y, bias)


def biased_conv_bind(*args):
    """:func:`biased_conv` for inputs of this signature."""
    return conv_epilogue_bind(biased_conv_reference, bind_epilogue)


def biased_conv(*args):
    """Launch; the caller has checked :func:`can_use`."""
    return biased_conv_bind(*args)(*args)


# (whether ATen would run the convolution on cuDNN needs the device: supports checks it)
BIASED_CONV = Impl(run=biased_conv, supports=can_use, bind=biased_conv_bind)
