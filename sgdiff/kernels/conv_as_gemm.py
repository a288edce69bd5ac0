"""sgdiff::pointwise_conv_act on CUDA: the convolution or the GEMM over the map's tokens, the faster.

Two paths compute a biased 1x1 convolution of a channels-last map and its activation:

* ``convolution``: eager's bits — cuDNN's convolution, then the bias and the activation (for a
  SiLU, in one pass: :mod:`sgdiff.kernels.conv_silu`, what ``lossless`` runs);
* ``gemm``: :mod:`sgdiff.kernels.linear_act` over the map's ``[B H W, C]`` tokens (cuBLAS's sums,
  the bias before one rounding, then the activation; or sgdiff's GEMM with the activation in its
  epilogue, the same bits), its product viewed as the channels-last map.

Both are within the op's ``close`` contract. At first sight of a signature (outside a CUDA-graph
capture) each is timed against the other (:class:`sgdiff.kernels.tuning.FirstSight`), the
convolution first: it is kept unless the GEMM is faster by the margin, so the tier never runs
slower than the one below it here; during a capture the convolution runs, unsettled.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch, tuning
from sgdiff.kernels.layout import map_tokens, tokens_map, weight_rows
from sgdiff.kernels.linear_act import ACTIVATIONS
from sgdiff.kernels.registry import Impl

HALF = (torch.float16, torch.bfloat16)


def _convolution(x, weight, bias, act):
    if act == "silu":
        return dispatch.run("conv_silu", x, weight, bias, [1, 1], [0, 0], [1, 1], 1)
    return ACTIVATIONS[act](F.conv2d(x, weight, bias))


def _gemm(x, weight, bias, act):
    return tokens_map(dispatch.run("linear_act", map_tokens(x), weight_rows(weight), bias, act), x)


CANDIDATES: Tuple[Tuple[str, Callable], ...] = (("convolution", _convolution), ("gemm", _gemm))
FIRST_SIGHT = tuning.FirstSight("pointwise_conv_act")


def supported_layout(x, weight, bias: Optional[torch.Tensor], act) -> bool:
    """A channels-last half-precision ``[B, C, H, W]`` map, a ``[N, C, 1, 1]`` weight, a 1-D bias."""
    return (x.dim() == 4 and x.dtype in HALF and weight.dtype == x.dtype and act in ACTIVATIONS
            and weight.dim() == 4 and tuple(weight.shape[1:]) == (x.shape[1], 1, 1)
            and map_tokens(x).is_contiguous() and x.numel() > 0
            and (bias is None or (bias.dim() == 1 and bias.dtype == x.dtype and bias.shape[0] == weight.shape[0])))


def choose(x, weight, bias, act) -> Tuple[str, Callable]:
    """The faster path for this signature, chosen once (``(name, fn)``)."""
    key = (tuple(x.shape), tuple(weight.shape), x.device, x.dtype, bias is not None, act, tuple(x.stride()))
    return FIRST_SIGHT.choose(key, CANDIDATES, (x, weight, bias, act))


def bind(x, weight, bias, act):
    return choose(x, weight, bias, act)[1]


def pointwise_conv_act(x, weight, bias, act):
    return bind(x, weight, bias, act)(x, weight, bias, act)


POINTWISE_CONV_ACT = Impl(run=pointwise_conv_act, supports=supported_layout, bind=bind)
