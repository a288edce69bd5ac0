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

from sgdiff.kernels import dispatch
from sgdiff.kernels.rms_norm import rms_norm_reference
from sgdiff.kernels.rope import rope_reference


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


rms_norm_rope = dispatch.define_op("rms_norm_rope", rms_norm_rope_reference)
