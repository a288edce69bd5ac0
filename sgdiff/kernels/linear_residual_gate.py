"""sgdiff::linear_residual_gate — a block's output projection and its gated residual, in one GEMM.

Eager chain (the attention's ``to_out`` and the feed-forward's last projection in Flux, SD3,
PixArt, Sana, Wan, QwenImage; Flux single blocks' ``proj_out`` over ``cat([attn, mlp])``)::

    u = F.linear(x, weight, bias)            # of cat([x, x2], -1) with x2; rounded to x.dtype
    y = residual + g(gate) * u               # sgdiff::residual_gate's steps and dtypes

``gate`` broadcasts to the output (``[B, 1, N]`` chunks, per-token ``[B, S, N]``), ``g`` is the
gate itself, its tanh or its sigmoid (``gate_kind``), mixed dtypes promote as in eager (Wan's
fp32 stream and gates) and ``out_dtype`` casts the sum. The residual is contiguous, so the
output is. Tuned per signature among the fused GEMM, cuBLAS followed by sgdiff's residual_gate
kernel, and the reference (cuBLAS and ATen's elementwise ops, the chain itself).
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear import linear_reference
from sgdiff.kernels.registry import Impl, KernelSpec, OpDef, cute, triton
from sgdiff.kernels.residual_gate import residual_gate_reference
from sgdiff.tiers import Contract


def linear_residual_gate_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: torch.Tensor,
    gate: torch.Tensor,
    gate_kind: str,
    out_dtype: Optional[torch.dtype] = None,
    x2: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    update = linear_reference(x, weight, bias, x2)
    return residual_gate_reference(residual, gate, update, gate_kind, True, None, None, out_dtype)


def _unfused(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None):
    """cuBLAS, then sgdiff::residual_gate's own kernel (the pair the fused GEMM must beat)."""
    update = linear_reference(x, weight, bias, x2)
    return dispatch.run("residual_gate", residual, gate, update, gate_kind, True, None, None, out_dtype)


UNFUSED = Impl(run=_unfused)


def _examples():
    for label, (S, D, F) in (("Flux.1-dev attention to_out", (4096, 3072, 3072)),
                             ("Flux.1-dev feed-forward down", (4096, 12288, 3072))):
        yield Example(f"{label} + gated residual", dict(B=1, S=S, D=D, F=F),
                      lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), t.randn(t.F),
                                 t.randn(t.B, t.S, t.F), t.chunks(t.B, t.F, 6)[2], "plain"),
                      small=dict(S=64, D=64, F=128), bench=False)
    yield Example("Flux.1-dev single block proj_out(cat([attn, mlp])) + gated residual",
                  dict(B=1, S=4608, D=3072, F=12288),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D, t.D + t.F, scale=(t.D + t.F) ** -0.5), t.randn(t.D),
                             t.randn(t.B, t.S, t.D), t.chunks(t.B, t.D, 3)[2], "plain", None, t.randn(t.B, t.S, t.F)),
                  small=dict(S=64, D=64, F=128), bench=False)
    # Wan: (x.float() + ffn(y).float() * gate).type_as(x), the gate an fp32 table chunk
    yield Example("Wan 2.1 1.3B FFN down, fp32 gate, cast back", dict(B=1, S=32760, D=8960, F=1536),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), t.randn(t.F),
                             t.randn(t.B, t.S, t.F), t.table_chunks(t.B, t.F, 6, torch.float32)[5], "plain",
                             torch.bfloat16),
                  small=dict(S=64, D=128, F=64), bench=False)
    yield Example("per-token tanh gate, no bias", dict(B=2, S=1024, D=2240, F=2240),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), None,
                             t.randn(t.B, t.S, t.F), t.randn(t.B, t.S, t.F), "tanh"),
                  small=dict(S=64, D=64, F=64), bench=False)


linear_residual_gate = dispatch.define_op(OpDef(
    "linear_residual_gate", Contract.BITEXACT, linear_residual_gate_reference,
    impls=(triton("gemm"), cute("gemm"),
           KernelSpec("", "unfused", None, "sgdiff.kernels.linear_residual_gate:UNFUSED", devices=frozenset({"cuda"}),
                      priority=5)),
    examples=tuple(_examples()), tuned=True,
    doc="residual + g(gate) * F.linear(x, weight, bias) (of cat([x, x2], -1) with x2) in eager's roundings and "
        "dtypes, the sum maybe cast to out_dtype: one GEMM with the gated residual as its epilogue, or cuBLAS and "
        "the residual_gate kernel, whichever is faster",
))
