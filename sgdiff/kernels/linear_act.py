"""sgdiff::linear_act — a linear layer and the activation of its output, in one GEMM.

Eager chain (diffusers ``GELU(approximate="tanh")`` / ``GELU()`` after a projection — Flux,
SD3, PixArt, Wan, QwenImage feed-forwards, Flux single blocks' ``proj_mlp`` — and a SiLU-gated
projection)::

    y = F.linear(x, weight, bias)          # cuBLAS: fp32 sum, bias, one rounding to x.dtype
    y = act(y)                             # ATen's GELU-tanh / GELU / SiLU in fp32, rounded again

Both roundings are kept: sgdiff's GEMM computes cuBLAS's bits (:mod:`sgdiff.kernels.linear`)
and applies ATen's activation to the rounded tile in registers, so the activation costs no
pass over the projection's (widest) output. Tuned per signature: where the fused GEMM is not
faster than cuBLAS and ATen's activation (the reference, the chain itself), that runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear import linear_reference
from sgdiff.kernels.registry import OpDef, cute, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten

#: the activations by the name the op takes, as ATen computes them
ACTIVATIONS = {
    "gelu_tanh": lambda y: aten.gelu.default(y, approximate="tanh"),
    "gelu": aten.gelu.default,
    "silu": aten.silu.default,
}


def linear_act_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    act: str,
) -> torch.Tensor:
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act](linear_reference(x, weight, bias))


def _examples():
    for label, (S, D, F) in (("Flux.1-dev feed-forward up", (4096, 3072, 12288)),
                             ("Flux.1-dev single block proj_mlp", (4608, 3072, 12288)),
                             ("Wan 2.1 1.3B FFN up", (32760, 1536, 8960))):
        yield Example(f"{label} + GELU-tanh", dict(B=1, S=S, D=D, F=F),
                      lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), t.randn(t.F), "gelu_tanh"),
                      small=dict(S=64, D=64, F=128), bench=False)
    yield Example("feed-forward up + GELU", dict(B=2, S=1024, D=1152, F=4608),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), t.randn(t.F), "gelu"),
                  small=dict(S=64, D=64, F=128), bench=False)
    yield Example("gate projection + SiLU, no bias", dict(B=2, S=1024, D=2240, F=5600),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.F, t.D, scale=t.D ** -0.5), None, "silu"),
                  small=dict(S=64, D=64, F=128), bench=False)


linear_act = dispatch.define_op(OpDef(
    "linear_act", Contract.BITEXACT, linear_act_reference, impls=(triton("gemm"), cute("gemm")), examples=tuple(_examples()),
    tuned=True,
    doc="act(F.linear(x, weight, bias)) with act gelu_tanh, gelu or silu, both roundings kept: one GEMM with the "
        "activation as its epilogue, or cuBLAS and ATen's activation where that is faster",
))
