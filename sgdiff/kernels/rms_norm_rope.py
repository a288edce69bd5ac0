"""sgdiff::rms_norm_rope — a QK RMSNorm and the rotary embedding right after it, in one pass.

Eager chain (Flux single blocks: ``attn.norm_q(query)`` then ``apply_rotary_emb``; the same
for keys)::

    y   = rms_norm(x, weight, eps, form)                 # sgdiff::rms_norm, rounded to its dtype
    out = rope(y, cos, sin, interleaved)                 # sgdiff::rope

Each step keeps its own rounding, so the pair needs nothing the two ops do not already state
(:mod:`sgdiff.kernels.rms_norm`, :mod:`sgdiff.kernels.rope`); a kernel saves writing ``y``
and reading it back. The reference implementation *is* the two chains, one after the other.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import rms_norm_reference
from sgdiff.kernels.rope import rope_reference
from sgdiff.tiers import Contract


def rms_norm_rope_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    return rope_reference(rms_norm_reference(x, weight, eps, form), cos, sin, interleaved)


def _flux_chain(x, weight, eps, form, cos, sin, interleaved):
    from diffusers.models.embeddings import apply_rotary_emb

    return lambda: apply_rotary_emb(F.rms_norm(x, x.shape[-1:], weight, eps), (cos[0, :, 0], sin[0, :, 0]),
                                    sequence_dim=1)


def _flux_q(t):
    x = t.randn(t.B, t.S, t.H * t.D).unflatten(-1, (t.H, t.D))  # a projection split into heads
    cos, sin = (t.randn(t.S, t.D, dtype=torch.float32)[None, :, None] for _ in range(2))
    return x, t.randn(t.D), 1e-6, "fused", cos, sin, True


rms_norm_rope = dispatch.define_op(OpDef(
    "rms_norm_rope", Contract.BITEXACT, rms_norm_rope_reference, impls=(triton("rms_norm_rope"),),
    examples=(
        Example("Flux.1-dev q, single block (QK norm + RoPE)", dict(B=1, S=4608, H=24, D=128), _flux_q,
                small=dict(S=64, H=3), chain=_flux_chain),
    ),
    doc="rope(rms_norm(x, weight, eps, form), cos, sin, interleaved): a QK norm and its RoPE",
))
