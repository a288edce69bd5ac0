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

from sgdiff.kernels import dispatch

aten = torch.ops.aten


def gelu_tanh_cat_reference(
    head: torch.Tensor,
    x: torch.Tensor,
) -> torch.Tensor:
    return aten.cat.default([head, aten.gelu.default(x, approximate="tanh")], -1)


gelu_tanh_cat = dispatch.define_op("gelu_tanh_cat", gelu_tanh_cat_reference)
