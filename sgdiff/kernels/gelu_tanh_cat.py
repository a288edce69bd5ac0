"""sgdiff::gelu_tanh_cat — a GELU-tanh written straight into the ``cat`` that follows it.

Eager chain (Flux single blocks: ``torch.cat([attn_output, act_mlp(proj_mlp(x))], dim=2)``
with ``act_mlp = GELU(approximate="tanh")``)::

    g = gelu(x, approximate="tanh")    # fp32 math, rounded to x.dtype
    y = cat([head, g], dim=-1)          # a copy; contiguous

Eager writes ``g`` and reads it back to copy it into ``y``; the op writes it once. Every output
element is either a copied ``head`` element or one GELU of one ``x`` element, so the op's
rounding is eager's. The reference implementation *is* that chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example, twice_out
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def gelu_tanh_cat_reference(
    head: torch.Tensor,
    x: torch.Tensor,
) -> torch.Tensor:
    return aten.cat.default([head, aten.gelu.default(x, approximate="tanh")], -1)


def _flux_single(t):
    """SDPA's output laid out ``[B, S, H D]`` (a view), and the MLP's projection."""
    head = t.randn(t.B, t.H, t.S, t.D).transpose(1, 2).flatten(2, 3)
    return head, t.randn(t.B, t.S, t.F, scale=3)


gelu_tanh_cat = dispatch.define_op(OpDef(
    "gelu_tanh_cat", Contract.BITEXACT, gelu_tanh_cat_reference, impls=(triton("gelu_tanh_cat"),),
    examples=(
        Example("Flux.1-dev single block, attention + MLP", dict(B=1, S=4608, H=24, D=128, F=12288), _flux_single,
                small=dict(S=64, H=3, F=1536), moved=twice_out,
                chain=lambda head, x: lambda: torch.cat([head, F.gelu(x, approximate="tanh")], dim=-1)),
        Example("a GELU of a projection and a cat", dict(R=8192, A=3072, G=768),
                lambda t: (t.randn(t.R, t.A), t.randn(t.R, t.G)), small=dict(R=128), moved=twice_out, bench=False),
    ),
    doc="cat([head, gelu(x, approximate='tanh')], dim=-1)",
))
