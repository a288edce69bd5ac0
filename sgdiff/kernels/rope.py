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
``x.dtype`` at the end; ``.float()``/``.to`` vanish for fp32 ``x``. The output has ``x``'s layout
(:mod:`sgdiff.kernels.layout`). The reference implementation *is* that chain, op for op.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.rms_norm import to

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
) -> torch.Tensor:
    rot = rotate(x, interleaved)
    x_term = aten.mul.Tensor(to(x, torch.float32), cos)
    rot_term = aten.mul.Tensor(to(rot, torch.float32), sin)
    del rot  # freed where the graph frees it: the allocator then reuses its memory
    return in_layout_of(to(aten.add.Tensor(x_term, rot_term), x.dtype), x)


rope = dispatch.define_op("rope", rope_reference)
