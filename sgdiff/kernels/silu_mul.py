"""sgdiff::silu_mul — the gated activation of a SwiGLU / GLU feed-forward.

Eager chain (Flux2 ``Flux2SwiGLU``: ``silu(x[..., :h]) * x[..., h:]``; Sana ``GLUMBConv``:
``x * silu(gate)`` of a ``chunk``; LLaMA-style ``silu(w1(x)) * w3(x)``)::

    y = silu(a)        # rounded to a.dtype
    y = y * b          # rounded to the promoted dtype

``a`` and ``b`` are the two operands as the product sees them (often two views of one
projection). The output has ``a``'s layout (:mod:`sgdiff.kernels.layout`: contiguous for
slices of a linear's output, channels-last for Sana's convolution). The reference
implementation *is* that chain.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layout import in_layout_of

aten = torch.ops.aten


def silu_mul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
) -> torch.Tensor:
    return in_layout_of(aten.mul.Tensor(aten.silu.default(a), b), a)


silu_mul = dispatch.define_op("silu_mul", silu_mul_reference)
