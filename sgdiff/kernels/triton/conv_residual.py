"""Triton sgdiff::conv_residual, bitwise equal to eager on CUDA.

The convolution runs as eager runs it, on cuDNN, without its bias
(:mod:`sgdiff.kernels.triton.conv_bias`); one pass then adds the bias (``add_``'s rounding),
the residual (the sum's) and multiplies by the divisor's reciprocal (ATen's division by a CPU
scalar), writing over the convolution's output, which nothing else reads. A program takes
``BLOCK`` elements of one channel's row, so the channel's bias is one load. Where a layout is
not contiguous (a channels-last ``x``, hence output; a transposed residual) the strided pass
of :mod:`sgdiff.kernels.triton.strided_epilogue` computes the same and writes eager's layout.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.conv_residual import conv_residual_reference
from sgdiff.kernels.layout import channels_last_strides, contiguous_strides
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import strided_epilogue
from sgdiff.kernels.triton.conv_bias import conv_epilogue_bind, conv_output_shape, on_cudnn
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.residual_gate import reciprocal, scales

BLOCK = 2048


@LeanKernel
@triton.jit
def _bias_residual_kernel(
    y_ptr, b_ptr, r_ptr,  # y: [N * C, S], written in place
    S, C, inv,
    DIVIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
):
    nc = tl.program_id(0)
    if WIDE:
        row = nc.to(tl.int64) * S
    else:
        row = nc * S
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = j < S
    grid_dependency_wait()
    y = tl.load(y_ptr + row + j, mask=inside, other=0.0)
    h = (y.to(tl.float32) + tl.load(b_ptr + nc % C).to(tl.float32)).to(y.dtype)
    s = (tl.load(r_ptr + row + j, mask=inside, other=0.0).to(tl.float32) + h.to(tl.float32)).to(y.dtype)
    if DIVIDE:
        s = (s.to(tl.float32) * inv).to(y.dtype)
    tl.store(y_ptr + row + j, s, mask=inside)


def supported_layout(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, residual, divisor=None,
                     conv_first=False, conv_as_contiguous=False) -> bool:
    """Everything but the device and the backend: a biased 2-D or 3-D convolution of a
    contiguous weight and a contiguous ``x`` (or a channels-last one, ``conv_as_contiguous``),
    a residual of the output's shape and dtype (the sum neither broadcasts nor promotes), a
    finite divisor or none. Where the convolution's output, the residual and the eager sum
    are all contiguous, one pass writes over the output; else the strided pass
    (:mod:`sgdiff.kernels.triton.strided_epilogue`) takes any layouts whose spatial dims are one run."""
    shape = conv_output_shape(x, conv_weight, conv_bias, stride, padding, dilation, conv_groups, conv_as_contiguous)
    if not (shape is not None and isinstance(residual, torch.Tensor) and tuple(residual.shape) == shape
            and residual.dtype == x.dtype and (divisor is None or isinstance(divisor, (int, float)))):
        return False
    if x.is_contiguous() and residual.is_contiguous():
        return triton.cdiv(residual.numel() // max(shape[0] * shape[1], 1), BLOCK) < 2 ** 16
    return strided_epilogue.fits(shape, strided_epilogue.eager_strides(shape, residual, conv_first), residual.stride(),
                                 channels_last_strides(shape) if not x.is_contiguous() else contiguous_strides(shape))


def can_use(*args) -> bool:
    return args[0].is_cuda and supported_layout(*args) and on_cudnn(*args[:7])


def bind_epilogue(y, conv_bias, residual, divisor=None, conv_first=False, conv_as_contiguous=False):
    """The pass over the bias-free convolution's output ``y``: ``epilogue(y, conv_bias, residual, ...)``."""
    if not (y.is_contiguous() and residual.is_contiguous()):
        out_strides = strided_epilogue.eager_strides(y.shape, residual, conv_first)
        strided = strided_epilogue.bind(y, residual, divisor, out_strides)
        return lambda y, conv_bias, residual, *_: strided(y, conv_bias, residual)
    rows = y.shape[0] * y.shape[1]
    s = y.numel() // rows
    inv = reciprocal(divisor) if divisor is not None else 1.0
    block = min(BLOCK, triton.next_power_of_2(s))
    kernel = _bias_residual_kernel.bind((rows, triton.cdiv(s, block)), DIVIDE=scales(inv), BLOCK=block,
                                        WIDE=y.numel() >= 2 ** 31, num_warps=max(1, min(8, block // 256)),
                                        enable_fp_fusion=False)
    c = y.shape[1]

    def epilogue(y, conv_bias, residual, *_):
        kernel(y, conv_bias, residual, s, c, inv)
        return y

    return epilogue


def conv_residual_bind(*args):
    """:func:`conv_residual` for inputs of this signature."""
    return conv_epilogue_bind(conv_residual_reference, bind_epilogue)


def conv_residual(*args):
    """Launch; the caller has checked :func:`can_use`."""
    return conv_residual_bind(*args)(*args)


# (whether ATen would run the convolution on cuDNN needs the device: supports checks it)
CONV_RESIDUAL = Impl(run=conv_residual, supports=can_use, bind=conv_residual_bind)
