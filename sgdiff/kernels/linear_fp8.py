"""sgdiff::linear_fp8 — a linear layer as an FP8 (e4m3) GEMM: dynamic per-row activation scales,
per-output-channel weight scales (the ``high`` tier).

Eager chain it stands for (``F.linear`` as ATen traces it: ``addmm(bias, x.view(-1, K),
weight.t())``, or ``mm`` without a bias), in bf16::

    y = x.view(-1, K) @ weight.T + bias          # [M, N]

This op is **not** that chain: each row of ``x`` and each row of ``weight`` (an output channel)
is scaled so that its largest magnitude is e4m3's largest finite value (448) and rounded to
e4m3 (round to nearest even); the product of the two e4m3 matrices is accumulated (in fp32, or
on Hopper in the tensor cores' FP8 accumulator),
multiplied by the row's and the channel's scales, the bias added, and rounded once to
``x.dtype``. The reference implementation is that math in fp32 (the quantization exactly as
the kernels do it, the GEMM in fp32); on CUDA, a Triton kernel quantizes the activation rows
and ``torch._scaled_mm`` (cuBLASLt / CUTLASS row-wise scaling, sm_89 and later) runs the GEMM.
The weight's e4m3 copy and scales are made once per weight and kept
(:mod:`sgdiff.kernels.triton.linear_fp8`). Contract ``approx``: FP8 keeps 3 mantissa bits, so
each operand carries a relative error up to 2^-4; what that costs over a trajectory is
bench/tiers.py's figure. On GPUs without FP8 GEMMs, the plain bf16 GEMM runs (more precise
than the contract).
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import KernelSpec, OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # e4m3's largest finite magnitude
SCALE_FLOOR = 1e-12  # a row of zeros keeps a positive scale (its values quantize to 0 anyway)
DTYPES = (torch.bfloat16,)  # the row-wise scaled GEMM writes bf16
MAX_K = 16384  # the quantization kernel holds a row whole in one program


def divide(x: torch.Tensor, number: float) -> torch.Tensor:
    """``x / number`` as an IEEE division, as the kernels' ``div_rn``: ATen divides by a Python
    number as a product with its fp32 reciprocal, which can differ in the last bit."""
    return x / aten.full_like.default(x, number)


def quantize_rows_reference(x: torch.Tensor):
    """``(q, scale)``: each row of a 2-D ``x`` as e4m3 values ``q`` and an fp32 scale per row
    (``scale = max(amax, SCALE_FLOOR) / 448``; ``q = round_e4m3(clamp(x * inverse, ±448))`` with
    ``inverse = 448 / max(amax, SCALE_FLOOR)``, one IEEE division a row), so that ``q * scale``
    approximates the row."""
    xf = x.float()
    amax = aten.clamp_min.default(aten.amax.default(aten.abs.default(xf), [1], True), SCALE_FLOOR)
    inverse = aten.full_like.default(amax, E4M3_MAX) / amax
    q = aten.clamp.default(xf * inverse, -E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, divide(amax, E4M3_MAX)


def linear_fp8_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x``: ``[..., K]``, its leading dims flattened to ``M`` rows; the output ``[M, N]`` (the
    GEMM's, as ``addmm`` gives it)."""
    xq, xs = quantize_rows_reference(x.reshape(-1, x.shape[-1]))
    wq, ws = quantize_rows_reference(weight)
    y = aten.mm.default(xq.float(), wq.float().t()) * xs * ws.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fp8_impls(fallback_backend: str, fallback: str, module: str = "linear_fp8",
              dtypes: frozenset = frozenset({"bfloat16"})) -> tuple:
    """An FP8 GEMM op's implementations: in ``sgdiff.kernels.triton.<module>`` (the op's name in
    capitals), on sm_89 and later, for a first argument of ``dtypes``; on GPUs without FP8 GEMMs,
    ``fallback`` of that module, the unquantized bf16 op (within the contract, and as fast as eager)."""
    return (triton(module, dtypes=dtypes, min_capability=(8, 9)),
            KernelSpec("", fallback_backend, None, f"sgdiff.kernels.triton.{module}:{fallback}",
                       devices=frozenset({"cuda"}), priority=1))


def _projection(t):
    return t.randn(t.M, t.K), t.randn(t.N, t.K, scale=t.K ** -0.5), t.randn(t.N, scale=0.1)


def _bf16_linear(x, weight, bias):
    """The eager chain: cuBLAS's bf16 GEMM (what the kernel bench times the op against)."""
    return lambda: torch.nn.functional.linear(x, weight, bias)


linear_fp8 = dispatch.define_op(OpDef(
    "linear_fp8", Contract.APPROX, linear_fp8_reference,
    impls=fp8_impls("cublas", "LINEAR_BF16"),
    examples=(
        Example("Flux.1-dev attention projection", dict(M=4608, K=3072, N=3072), _projection,
                small=dict(M=64, K=128, N=96), chain=_bf16_linear),
        Example("Flux.1-dev feed-forward down", dict(M=4608, K=12288, N=3072), _projection,
                small=dict(M=64, K=256, N=64), chain=_bf16_linear),
        Example("Wan 2.1 1.3B feed-forward up", dict(M=32760, K=1536, N=8960), _projection,
                small=dict(M=80, K=64, N=128), chain=_bf16_linear),
    ),
    doc="x @ weight.T + bias with x's rows and weight's rows (output channels) each scaled to e4m3 and "
        "quantized (round to nearest even), the e4m3 product accumulated (fp32, or Hopper's FP8 accumulator), "
        "the scales and the bias applied in fp32, one rounding to x.dtype (bf16). Operand relative error up to "
        "2^-4; the weight's e4m3 copy is made once per weight and version",
    caches_inputs=True,
))
