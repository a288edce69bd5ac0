"""sgdiff::linear_gelu_tanh on CUDA: the GEMM with its bias and GELU-tanh as cuBLASLt's epilogue.

ATen's ``_addmm_activation(bias, x, weight.t(), use_gelu=True)`` runs cuBLASLt with
``CUBLASLT_EPILOGUE_GELU_BIAS``: the product accumulated in fp32, the bias added and GELU-tanh
applied to the fp32 sum, one rounding to the output dtype — the op's contract (``close``).
Where cuBLASLt cannot take the epilogue (ATen decides), ATen runs ``addmm`` and then
``gelu_(approximate="tanh")``, which is the eager chain itself. Either way the GELU costs no
pass of its own over the feed-forward's widest activation.

fp32 is left to the reference: there the eager chain is already one fp32 pass, bitwise.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff import _compat
from sgdiff.kernels.registry import Impl

HALF = (torch.float16, torch.bfloat16)


def can_use(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    return x.is_cuda and supported_layout(x, weight, bias)


def supported_layout(x, weight, bias) -> bool:
    """Everything but the device: a linear layer of one half dtype."""
    return (x.dtype in HALF and x.dim() >= 1 and weight.dim() == 2 and weight.dtype == x.dtype
            and x.shape[-1] == weight.shape[1] and x.numel() > 0 and weight.shape[0] > 0
            and (bias is None or (bias.dim() == 1 and bias.dtype == x.dtype and bias.shape[0] == weight.shape[0])))


def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Launch; the caller has checked :func:`can_use`. Contiguous output, as the reference's."""
    n = weight.shape[0]
    if bias is None:  # the epilogue takes a bias; adding zeros to the fp32 sum changes no value
        bias = x.new_zeros(n)
    y = _compat.addmm_gelu_tanh(bias, x.reshape(-1, x.shape[-1]), weight.t())
    return y.view(*x.shape[:-1], n)


LINEAR_GELU_TANH = Impl(run=linear_gelu_tanh, supports=supported_layout)
