"""sgdiff::silu_mul — the gated activation of a SwiGLU / GLU feed-forward.

Eager chain (Flux2 ``Flux2SwiGLU``: ``silu(x[..., :h]) * x[..., h:]``; Sana ``GLUMBConv``:
``x * silu(gate)`` of a ``chunk``; LLaMA-style ``silu(w1(x)) * w3(x)``)::

    y = silu(a)        # rounded to a.dtype
    y = y * b          # rounded to the promoted dtype

``a`` and ``b`` are the two operands as the product sees them (often two views of one
projection). ``wide_silu``: the SiLU taken of ``a.float()`` and cast back (diffusers' ``FP32SiLU``,
Lumina's feed-forward): the same fp32 arithmetic as ATen's SiLU of a half-precision ``a`` and the
same rounding, so the kernel is the same; first sight checks it against this spelling. The output has ``a``'s layout (:mod:`sgdiff.kernels.layout`: contiguous for
slices of a linear's output, channels-last for Sana's convolution). The reference
implementation *is* that chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def silu_mul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    wide_silu: bool = False,
) -> torch.Tensor:
    if wide_silu:  # diffusers' FP32SiLU (Lumina's feed-forward): silu(a.float()).to(a.dtype)
        g = aten._to_copy.default(aten.silu.default(aten._to_copy.default(a, dtype=torch.float32)), dtype=a.dtype)
    else:
        g = aten.silu.default(a)
    return in_layout_of(aten.mul.Tensor(g, b), a)


def _sana_glu(t):
    """The halves of Sana's depthwise convolution output, channels-last: ``(gate, hidden)``."""
    conv = t.randn(t.B, 2 * t.C, t.H, t.W).to(memory_format=torch.channels_last)
    hidden, gate = conv.chunk(2, dim=1)
    return gate, hidden


silu_mul = dispatch.define_op(OpDef(
    "silu_mul", Contract.BITEXACT, silu_mul_reference, impls=(triton("silu_mul"),),
    examples=(
        Example("Sana 1.6B GLU, channels-last chunks", dict(B=2, C=5600, H=32, W=32), _sana_glu,
                small=dict(C=96, H=8, W=8), chain=lambda gate, hidden: lambda: hidden * F.silu(gate)),
        Example("SwiGLU halves of a projection", dict(B=1, S=4608, F=12288),
                lambda t: tuple(t.randn(t.B, t.S, 2 * t.F).chunk(2, dim=-1)), small=dict(S=64, F=4096),
                chain=lambda a, b: lambda: F.silu(a) * b),
    ),
    doc="silu(a) * b (wide_silu: silu(a.float()).to(a.dtype) * b)",
))
