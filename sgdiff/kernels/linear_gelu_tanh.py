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
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import KernelSpec, OpDef
from sgdiff.kernels.rms_norm import to
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_gelu_tanh_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    f32 = torch.float32
    y = aten.linear.default(to(x, f32), to(weight, f32), None if bias is None else to(bias, f32))
    return to(aten.gelu.default(y, approximate="tanh"), x.dtype).contiguous()


linear_gelu_tanh = dispatch.define_op(OpDef(
    "linear_gelu_tanh", Contract.CLOSE, linear_gelu_tanh_reference,
    # the feed-forward GEMM and its GELU as one cuBLASLt call (close: one fp32 pass)
    impls=(KernelSpec("", "cublaslt", None, "sgdiff.kernels.cublaslt:LINEAR_GELU_TANH", devices=frozenset({"cuda"}),
                      dtypes=frozenset({"float16", "bfloat16"}), priority=10),),
    examples=(
        Example("Flux.1-dev feed-forward up", dict(B=1, S=4608, D=3072, F=12288),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), t.randn(t.F)),
                small=dict(S=16, D=64, F=256), bench=False),
    ),
    doc="gelu_tanh(x @ weight.T + bias) in one fp32 pass, one rounding to x.dtype. fp32: bitwise "
        "equal to eager. fp16/bf16 (measured, tests/test_activation.py): a third of the elements "
        "differ from eager's two roundings, by at most 2 ulps where |out| >= 0.1 and at most "
        "2^-10 (fp16) / 2^-7 (bf16) of max |out| anywhere. On CUDA: cuBLASLt's GELU_BIAS epilogue "
        "(tests/gpu/test_linear_gelu_gpu.py checks the same bounds)",
))
