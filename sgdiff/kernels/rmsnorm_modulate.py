"""sgdiff::rmsnorm_modulate — adaLN modulation of an RMSNorm over the last dim.

Eager chain (e.g. LTX-Video, Lumina2, HiDream: an RMSNorm, then the DiT modulation)::

    y = rms_norm(x, weight, eps)        # one of the forms of sgdiff::rms_norm, rounded as it rounds
    y = y * (1 + scale)                 # 1 + scale rounded to scale.dtype, the product to the promoted dtype
    y = y + shift                       # rounded to the promoted dtype; absent for scale-only chains

``scale`` and ``shift`` are any tensors that broadcast to ``x`` ([B,1,D], [B,S,D], [D], ...).
The reference implementation *is* that chain, op for op; the output is contiguous.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.modulate import modulation
from sgdiff.kernels.rms_norm import rms_norm_chain


def rmsnorm_modulate_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
) -> torch.Tensor:
    return modulation(rms_norm_chain(x, weight, eps, form), scale, shift)


rmsnorm_modulate = dispatch.define_op("rmsnorm_modulate", rmsnorm_modulate_reference)
