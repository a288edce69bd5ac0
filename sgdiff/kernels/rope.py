"""sgdiff::rope — rotary embedding with real cos/sin tables (diffusers ``apply_rotary_emb``, ``use_real=True``).

Eager chain, for ``x`` of shape [B, S, H, D] or [B, H, S, D]::

    interleaved (use_real_unbind_dim=-1; Flux, CogVideoX, HunyuanDiT):
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rot = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    rotate-half (use_real_unbind_dim=-2; Stable Audio, CogView4, Cosmos):
        x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
        x_rot = torch.cat([-x_imag, x_real], dim=-1)
    out = (x.float() * cos + x_rot.float() * sin).to(x.dtype)

``cos``/``sin`` are the tables as the products see them (e.g. ``cos[None, :, None, :]``), usually
fp32. Rounding: each product and the sum in the promoted dtype (fp32), one rounding to
``x.dtype`` at the end; ``.float()``/``.to`` vanish for fp32 ``x``. With ``arith_dtype`` the chain
is ``x * cos + x_rot * sin`` as written, without casts: each product and the sum in their
promoted dtype, ``arith_dtype`` (bf16 products of bf16 tables: Ideogram 4; fp32 ones of fp32
tables, the result left in fp32). The output has ``x``'s layout
(:mod:`sgdiff.kernels.layout`). The reference implementation *is* that chain, op for op.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import to
from sgdiff.tiers import Contract

aten = torch.ops.aten


def rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``x_rot`` of the docstring: (-imag, real) pairs, interleaved or as two halves."""
    lead = list(x.shape[:-1])
    if interleaved:
        real, imag = aten.unbind.int(aten.reshape.default(x, lead + [-1, 2]), -1)
        return aten.reshape.default(aten.stack.default([aten.neg.default(imag), real], -1), x.shape)
    real, imag = aten.unbind.int(aten.reshape.default(x, lead + [2, -1]), -2)
    return aten.cat.default([aten.neg.default(imag), real], -1)


def rope_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    arith_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    rot = rotate(x, interleaved)
    if arith_dtype is not None:  # as written, no casts: each op in its promoted dtype (arith_dtype)
        return in_layout_of(aten.add.Tensor(aten.mul.Tensor(x, cos), aten.mul.Tensor(rot, sin)), x)
    x_term = aten.mul.Tensor(to(x, torch.float32), cos)
    rot_term = aten.mul.Tensor(to(rot, torch.float32), sin)
    del rot  # freed where the graph frees it: the allocator then reuses its memory
    return in_layout_of(to(aten.add.Tensor(x_term, rot_term), x.dtype), x)


def _flux_chain(x, cos, sin, interleaved):
    """diffusers' ``apply_rotary_emb`` (use_real) on a ``[B, S, H, D]`` q."""
    from diffusers.models.embeddings import apply_rotary_emb

    freqs = (cos[0, :, 0], sin[0, :, 0])
    return lambda: apply_rotary_emb(x, freqs, use_real_unbind_dim=-1 if interleaved else -2, sequence_dim=1)


def _flux(interleaved):
    return lambda t: (t.randn(t.B, t.S, t.H, t.D), t.randn(t.S, t.D, dtype=torch.float32)[None, :, None],
                      t.randn(t.S, t.D, dtype=torch.float32)[None, :, None], interleaved)


rope = dispatch.define_op(OpDef(
    "rope", Contract.BITEXACT, rope_reference, impls=(triton("rope"),),
    examples=(
        Example("Flux.1-dev q, interleaved", dict(B=1, S=4608, H=24, D=128), _flux(True),
                small=dict(S=64, H=3), chain=_flux_chain),
        Example("Flux.1-dev q, rotate-half", dict(B=1, S=4608, H=24, D=128), _flux(False),
                small=dict(S=64, H=3), chain=_flux_chain),
        Example("rotate-half in bf16 throughout (bf16 tables, no casts: Ideogram 4)", dict(B=1, S=4096, H=16, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), t.randn(t.S, t.D)[None, :, None],
                           t.randn(t.S, t.D)[None, :, None], False, torch.bfloat16),
                small=dict(S=64, H=3), bench=False),
        Example("interleaved, widened and left in fp32 (not cast back)", dict(B=1, S=4608, H=24, D=128),
                lambda t: (*_flux(True)(t)[:4], torch.float32), small=dict(S=64, H=3), bench=False),
        Example("rotate-half, heads first", dict(B=1, S=4608, H=24, D=128),
                lambda t: (t.randn(t.B, t.H, t.S, t.D), t.randn(t.S, t.D, dtype=torch.float32)[None, None],
                           t.randn(t.S, t.D, dtype=torch.float32)[None, None], False),
                small=dict(S=64, H=3), bench=False),
    ),
    doc="(x.float() * cos + rotate(x).float() * sin).to(x.dtype), interleaved pairs or rotate-half; with "
        "arith_dtype, x * cos + rotate(x) * sin with no casts (each op in arith_dtype, the promoted one)",
))
