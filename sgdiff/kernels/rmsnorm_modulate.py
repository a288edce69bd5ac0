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
from sgdiff.kernels.examples import Example
from sgdiff.kernels.modulate import modulation
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import module_chain, rms_norm_chain
from sgdiff.tiers import Contract


def rmsnorm_modulate_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
) -> torch.Tensor:
    return modulation(rms_norm_chain(x, weight, eps, form), scale, shift)


def _diffusers_chain(x, weight, eps, form, scale, shift):
    norm = module_chain(x, weight, eps, form)
    if shift is None:  # Lumina-Image 2.0: scale only
        return lambda: norm() * (1 + scale)
    return lambda: norm() * (1 + scale) + shift


def _ltx(t):
    """LTX-Video's blocks: no weight, table + temb rows unbound from one tensor."""
    shift, scale = t.table_rows(t.B, t.D, 6)[:2]
    return t.randn(t.B, t.S, t.D), None, 1e-6, "diffusers", scale, shift


rmsnorm_modulate = dispatch.define_op(OpDef(
    "rmsnorm_modulate", Contract.BITEXACT, rmsnorm_modulate_reference, impls=(triton("rmsnorm_modulate"),),
    examples=(
        Example("LTX-Video 2B: RMSNorm(x) * (1 + scale) + shift", dict(B=2, S=6144, D=2048), _ltx,
                chain=_diffusers_chain),
        Example("Lumina-Image 2.0: RMSNorm(x) * (1 + scale), affine", dict(B=2, S=4352, D=2304),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D), 1e-5, "diffusers", t.chunks(t.B, t.D, 4)[0], None),
                chain=_diffusers_chain),
        Example("diffusers per head, per token", dict(B=1, S=4608, H=24, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), t.randn(t.D), 1e-6, "diffusers", t.randn(t.B, t.S, t.H, t.D),
                           t.randn(t.B, t.S, t.H, t.D)), small=dict(S=64, H=3), bench=False),
        Example("fused, chunks", dict(B=2, S=4096, D=3072),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D), 1e-6, "fused", *t.chunks(t.B, t.D, 2)), bench=False),
        Example("fused, fp32 scale", dict(B=2, S=4096, D=1536),
                lambda t: (t.randn(t.B, t.S, t.D), None, 1e-6, "fused", t.randn(t.B, 1, t.D, dtype=torch.float32),
                           t.randn(t.B, 1, t.D)), bench=False),
    ),
    doc="rms_norm(x, weight, eps, form) * (1 + scale) + shift, each eager rounding kept",
))
