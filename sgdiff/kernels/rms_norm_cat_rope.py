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

from sgdiff.kernels import dispatch
from sgdiff.kernels.rms_norm import rms_norm_reference
from sgdiff.kernels.rope import rope_reference

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


rms_norm_cat_rope = dispatch.define_op("rms_norm_cat_rope", rms_norm_cat_rope_reference)
