"""sgdiff::rms_norm_cat_rope — two QK RMSNorms, their ``cat`` along the sequence, and the RoPE.

Eager chain (Flux double blocks: text and image queries are normalized apart, joined, rotated;
the same for keys)::

    y   = cat([rms_norm(x0, w0, eps, form), rms_norm(x1, w1, eps, form)], dim=1)   # [B, S0 + S1, H, D]
    out = rope(y, cos, sin, interleaved)

Each step keeps its own rounding (:mod:`sgdiff.kernels.rms_norm`, :mod:`sgdiff.kernels.rope`);
``cat`` only moves values. The reference implementation *is* that chain.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example, twice_out
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import rms_norm_reference
from sgdiff.kernels.rope import rope_reference
from sgdiff.tiers import Contract

aten = torch.ops.aten


def rms_norm_cat_rope_reference(
    x0: torch.Tensor,
    w0: Optional[torch.Tensor],
    x1: torch.Tensor,
    w1: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    y = aten.cat.default([rms_norm_reference(x0, w0, eps, form), rms_norm_reference(x1, w1, eps, form)], 1)
    return rope_reference(y, cos, sin, interleaved)


def _flux_chain(x0, w0, x1, w1, eps, form, cos, sin, interleaved):
    from diffusers.models.embeddings import apply_rotary_emb

    def chain():
        joined = torch.cat([F.rms_norm(x0, x0.shape[-1:], w0, eps), F.rms_norm(x1, x1.shape[-1:], w1, eps)], dim=1)
        return apply_rotary_emb(joined, (cos[0, :, 0], sin[0, :, 0]), sequence_dim=1)

    return chain


def _flux_double(t):
    """Text and image queries of one projection, normalized apart, then joined."""
    x = t.randn(t.B, t.S, t.H * t.D).unflatten(-1, (t.H, t.D))
    cos, sin = (t.randn(t.S, t.D, dtype=torch.float32)[None, :, None] for _ in range(2))
    return x[:, :t.T], t.randn(t.D), x[:, t.T:], t.randn(t.D), 1e-6, "fused", cos, sin, True


rms_norm_cat_rope = dispatch.define_op(OpDef(
    "rms_norm_cat_rope", Contract.BITEXACT, rms_norm_cat_rope_reference, impls=(triton("rms_norm_rope"),),
    examples=(
        Example("Flux.1-dev q, double block (2 QK norms, cat, RoPE)", dict(B=1, S=4608, T=512, H=24, D=128),
                _flux_double, small=dict(S=64, T=16, H=3), moved=twice_out, chain=_flux_chain),
    ),
    doc="rope(cat([rms_norm(x0, w0, eps, form), rms_norm(x1, w1, eps, form)], 1), cos, sin, interleaved)",
))
