"""What the convolution-epilogue kernels share: cuDNN's bias-free convolution, then one pass.

ATen runs a biased convolution on cuDNN as ``y = cudnn_convolution(x, weight)`` and then
``y.add_(bias)`` (an fp32 sum per element, rounded to ``y.dtype``): cuDNN convolutions do not
take the bias. An op that also computes what reads ``y`` (an activation, a norm, a residual
add) can run the bias-free convolution and add the bias where it first reads ``y``, rounding it
there as ``add_`` does, and skip ``add_``'s pass. Only where ATen picks cuDNN: its other CUDA
paths (depthwise kernels, ...) add the bias inside the convolution, before rounding.
"""
from __future__ import annotations

from sgdiff import _compat
from sgdiff.kernels.conv_silu import convolution
from sgdiff.kernels.layout import is_channels_last
from sgdiff.kernels.triton.rows import DTYPES


def supported_conv(x, weight, bias, stride, padding, dilation, groups) -> bool:
    """Everything but the device and the backend: a biased 2-D or 3-D convolution in one float
    dtype."""
    return (x.dim() in (4, 5) and weight.dim() == x.dim() and bias is not None and bias.dim() == 1
            and x.dtype in DTYPES and weight.dtype == bias.dtype == x.dtype
            and bias.shape[0] == weight.shape[0] and x.numel() > 0)


def conv_output_shape(x, weight, bias, stride, padding, dilation, groups, as_contiguous=False):
    """The output shape of a supported convolution (:func:`supported_conv`) of a contiguous
    weight and a contiguous ``x`` (cuDNN then writes the output contiguous), or of a
    channels-last ``x`` where the op computes as on a contiguous one (``as_contiguous``: cuDNN
    writes channels-last, and its bits are the contiguous convolution's, which first sight
    verifies); None for any other."""
    if not (supported_conv(x, weight, bias, stride, padding, dilation, groups) and weight.is_contiguous()
            and (x.is_contiguous() or (as_contiguous and is_channels_last(x)))):
        return None
    return (x.shape[0], weight.shape[0], *conv_spatial_size(x, weight, stride, padding, dilation))


def conv_spatial_size(x, weight, stride, padding, dilation) -> tuple:
    """A (not transposed) convolution's output sizes along the spatial dims."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                 zip(x.shape[2:], weight.shape[2:], stride, padding, dilation))


def on_cudnn(x, weight, bias, stride, padding, dilation, groups) -> bool:
    """Whether ATen runs this convolution on cuDNN (and so adds the bias afterwards)."""
    return _compat.convolution_on_cudnn(x, weight, bias, stride, padding, dilation, groups)


def conv_epilogue_bind(reference, bind_epilogue):
    """A launch of cuDNN's bias-free convolution and then the epilogue, the epilogue bound at
    the first call (it needs the convolution's output, whose geometry the signature fixes).
    ``bind_epilogue(y, bias, *rest)`` returns ``epilogue(y, bias, *rest)``, ``rest`` being the
    op's arguments after the convolution's. (Whether cuDNN is enabled is a process setting, not
    part of the input: with it off, the chain runs.)"""
    epilogue = []

    def launch(x, weight, bias, stride, padding, dilation, groups, *rest):
        if not _compat.cudnn_enabled():
            return reference(x, weight, bias, stride, padding, dilation, groups, *rest)
        y = convolution(x, weight, None, stride, padding, dilation, groups)
        if not epilogue:
            epilogue.append(bind_epilogue(y, bias, *rest))
        return epilogue[0](y, bias, *rest)

    return launch
