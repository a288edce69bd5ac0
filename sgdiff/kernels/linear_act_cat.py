"""sgdiff::linear_act_cat — a projection's activation stored straight into the ``cat`` after it.

Eager chain (Flux single blocks: ``torch.cat([attn_output, act_mlp(proj_mlp(norm_hidden_states))],
dim=2)`` with ``act_mlp = GELU(approximate="tanh")``; the activation family makes the GELU and
the cat one op first, :mod:`sgdiff.kernels.gelu_tanh_cat`)::

    y = F.linear(x, weight, bias)            # cuBLAS: fp32 sum, bias, one rounding to x.dtype
    g = act(y)                               # ATen's activation in fp32, rounded again
    out = cat([head, g], -1)                 # a copy; contiguous

sgdiff's GEMM computes cuBLAS's bits and applies ATen's activation to the rounded tile
(:mod:`sgdiff.kernels.linear_act`); here its store writes the tile where the cat holds it, and
``head`` (the attention's output, read through its strides) is copied into the first columns.
Neither the projection nor its activation is written and read back: at Flux's shape (4608
tokens, 12288 columns) the projection alone is 0.11 GB, written once and read once a single
block. Tuned per signature among the fused GEMM, cuBLAS followed by gelu_tanh_cat's kernel (the
pair it must beat), and the reference (the chain itself).
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear import linear_reference
from sgdiff.kernels.linear_act import linear_act_reference
from sgdiff.kernels.registry import Impl, KernelSpec, OpDef, cute
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_act_cat_reference(
    head: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    act: str,
) -> torch.Tensor:
    return aten.cat.default([head, linear_act_reference(x, weight, bias, act)], -1)


def _unfused(head, x, weight, bias, act):
    """cuBLAS, then gelu_tanh_cat's own kernel (the pair the fused GEMM must beat); the reference
    for another activation."""
    if act != "gelu_tanh":
        return linear_act_cat_reference(head, x, weight, bias, act)
    return dispatch.run("gelu_tanh_cat", head, linear_reference(x, weight, bias))


UNFUSED = Impl(run=_unfused)


def _flux_single(t):
    """SDPA's output laid out ``[B, S, H D]`` (a view), the normalized tokens, proj_mlp's weight and bias."""
    head = t.randn(t.B, t.H, t.S, t.D).transpose(1, 2).flatten(2, 3)
    return head, t.randn(t.B, t.S, t.H * t.D), t.randn(t.F, t.H * t.D, scale=(t.H * t.D) ** -0.5), t.randn(t.F), \
        "gelu_tanh"


linear_act_cat = dispatch.define_op(OpDef(
    "linear_act_cat", Contract.BITEXACT, linear_act_cat_reference,
    impls=(cute("gemm"),
           KernelSpec("", "unfused", None, "sgdiff.kernels.linear_act_cat:UNFUSED", devices=frozenset({"cuda"}),
                      priority=5)),
    examples=(Example("Flux.1-dev single block, attention + proj_mlp's GELU", dict(B=1, S=4608, H=24, D=128, F=12288),
                      _flux_single, small=dict(S=64, H=2, D=32, F=128), bench=False),),
    tuned=True,
    doc="cat([head, act(F.linear(x, weight, bias))], -1), both roundings kept: one GEMM storing its activated "
        "tiles into the cat, head copied beside them; or cuBLAS and gelu_tanh_cat's kernel where that is faster",
))
