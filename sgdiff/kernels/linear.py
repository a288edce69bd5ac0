"""sgdiff::linear — a linear layer at cuBLAS's bits, the faster of cuBLAS and sgdiff's GEMM.

Eager chain (``F.linear`` as ATen traces it, ``nn.Linear``'s weight ``[N, K]``)::

    y = addmm(bias, x.view(-1, K), weight.t())     # mm without a bias
    y = y.view(*x.shape[:-1], N)

and, with ``x2``, the linear of ``cat([x, x2], -1)`` (Flux single blocks' ``proj_out`` over the
attention output and the MLP's), with no cat in memory: the GEMM reads both operands along K in
order. A non-split-K GEMM's output is the same fp32 sum of K in increasing order wherever it
runs (:mod:`sgdiff.kernels.triton.gemm`), so both implementations give these bits; the op is
``tuned``: first sight of a signature verifies each against cuBLAS and keeps the faster.
Where cuBLAS picks split-K for a shape the Triton kernel differs, and that signature stays on
cuBLAS. The reference (cuBLAS itself) is the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, cute, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    x2: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    if x2 is not None:
        x = aten.cat.default([x, x2], -1)
    rows = aten.reshape.default(x, [-1, x.shape[-1]])
    wt = aten.t.default(weight)
    y = aten.addmm.default(bias, rows, wt) if bias is not None else aten.mm.default(rows, wt)
    return aten.view.default(y, [*x.shape[:-1], weight.shape[0]])


def _examples():
    yield Example("Flux.1-dev single block proj_out(cat([attn, mlp]))", dict(B=1, S=4608, D=3072, F=12288),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D, t.D + t.F, scale=(t.D + t.F) ** -0.5), t.randn(t.D),
                             t.randn(t.B, t.S, t.F)),
                  small=dict(S=64, D=64, F=128), bench=False)
    yield Example("Wan 2.1 1.3B FFN down", dict(B=1, S=32760, D=1536, F=8960),
                  lambda t: (t.randn(t.B, t.S, t.F), t.randn(t.D, t.F, scale=t.F ** -0.5), t.randn(t.D)),
                  small=dict(S=64, D=64, F=128), bench=False)
    yield Example("Flux.1-dev attention to_q, no bias", dict(B=1, S=4096, D=3072),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D, t.D, scale=t.D ** -0.5)),
                  small=dict(S=64, D=64), bench=False)


linear = dispatch.define_op(OpDef(
    "linear", Contract.BITEXACT, linear_reference, impls=(triton("gemm"), cute("gemm")), examples=tuple(_examples()),
    tuned=True,
    doc="F.linear(x, weight, bias) (of cat([x, x2], -1) with x2) at cuBLAS's bits: the faster of cuBLAS and "
        "sgdiff's GEMM per signature",
))
