"""sgdiff::linear_gelu_tanh — a linear layer with its bias and GELU-tanh in one fp32 pass.

Eager chain it replaces (diffusers ``GELU(approximate="tanh")`` after a projection: Flux, SD3,
PixArt, Wan and QwenImage feed-forwards, Flux single blocks)::

    y = F.linear(x, weight, bias)              # GEMM + bias, rounded to x.dtype
    y = F.gelu(y, approximate="tanh")          # computed in fp32, rounded to x.dtype again

This op is **not** that chain: it is the fused epilogue a GEMM kernel runs (cuBLASLt
``GELU_BIAS``, a Triton matmul epilogue): the product accumulated in fp32, the bias added and
GELU-tanh applied in fp32, one rounding to ``x.dtype``. The reference implementation is that
fp32 math. For fp32 inputs it is the eager chain itself (bitwise equal); for fp16/bf16 it
skips the intermediate rounding, hence its contract ``close``.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.rms_norm import to

aten = torch.ops.aten


def linear_gelu_tanh_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    f32 = torch.float32
    y = aten.linear.default(to(x, f32), to(weight, f32), None if bias is None else to(bias, f32))
    return to(aten.gelu.default(y, approximate="tanh"), x.dtype).contiguous()


linear_gelu_tanh = dispatch.define_op("linear_gelu_tanh", linear_gelu_tanh_reference)
