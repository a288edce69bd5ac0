"""sgdiff::rms_norm_heads_rope — an RMSNorm over all heads, the split into heads, and the rotary
embedding, in one pass.

Eager chain (Wan's attention: ``norm_q`` over the whole projection, ``unflatten(2, (heads,
-1))``, then its RoPE written into even/odd slots; the same for keys)::

    y   = rms_norm(x, weight, eps, form).unflatten(-1, (heads, -1))   # sgdiff::rms_norm, rounded to x.dtype
    out = rope_even_odd(y, cos, sin)          # rotation "even_odd": sgdiff::rope_even_odd
    out = rope(y, cos, sin, interleaved)      # rotation "interleaved" or "halves": sgdiff::rope

Each step keeps its own rounding, so the chain needs nothing the ops do not already state
(:mod:`sgdiff.kernels.rms_norm`, :mod:`sgdiff.kernels.rope_even_odd`, :mod:`sgdiff.kernels.rope`);
a kernel saves writing ``y`` and reading it back. The reference implementation *is* the chain.
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
from sgdiff.kernels.rope_even_odd import rope_even_odd_reference
from sgdiff.tiers import Contract

ROTATIONS = ("interleaved", "halves", "even_odd")  # in the order of the kernel's ROTATION


def rms_norm_heads_rope_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
    heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotation: str,
) -> torch.Tensor:
    if rotation not in ROTATIONS:
        raise ValueError(f"unknown rotation {rotation!r}; known: {', '.join(ROTATIONS)}")
    y = rms_norm_reference(x, weight, eps, form).unflatten(-1, (heads, -1))
    if rotation == "even_odd":
        return rope_even_odd_reference(y, cos, sin)
    return rope_reference(y, cos, sin, rotation == "interleaved")


def _wan_chain(x, weight, eps, form, heads, cos, sin, rotation):
    """Wan's own spelling: ``norm_q``, ``unflatten``, then the processor's even/odd rotation."""

    def chain():
        y = F.rms_norm(x, x.shape[-1:], weight, eps).unflatten(2, (heads, -1))
        x1, x2 = y.unflatten(-1, (-1, 2)).unbind(-1)
        out = torch.empty_like(y)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out.type_as(y)

    return chain


def _wan_q(t):
    """Wan's q projection [B, S, H * D], its norm's weight, and the tables as the processor slices them."""
    freqs = [t.randn(1, t.S, 1, t.D, dtype=torch.float32) for _ in range(2)]
    return (t.randn(t.B, t.S, t.H * t.D), t.randn(t.H * t.D), 1e-6, "fused", t.H, freqs[0][..., 0::2],
            freqs[1][..., 1::2], "even_odd")


rms_norm_heads_rope = dispatch.define_op(OpDef(
    "rms_norm_heads_rope", Contract.BITEXACT, rms_norm_heads_rope_reference, impls=(triton("rms_norm_rope"),),
    examples=(
        Example("Wan 2.1 1.3B q (norm over all heads, even/odd RoPE)", dict(B=1, S=32760, H=12, D=128), _wan_q,
                small=dict(S=64, H=3), chain=_wan_chain),
    ),
    doc="rope(rms_norm(x, weight, eps, form).unflatten(-1, (heads, -1)), cos, sin): an RMSNorm over every "
        "head (Wan's QK norm), the split into heads and the RoPE (even/odd slots, interleaved or halves)",
))
