"""sgdiff::cast_copy — a tensor, optionally through a ReLU, cast to another dtype and optionally
padded: contiguous, or in the input's layout.

Eager chains (Sana's ``SanaLinearAttnProcessor2_0``, per block, on the [B, heads, head_dim,
tokens] views of the q/k/v projections)::

    q = relu(q).float()        # a copy in q's layout; then, where matmul cannot view it as
    k = relu(k).float()        # [B * heads, ., .] (batch > 1), expand + clone: a contiguous copy
    v = F.pad(v.float(), (0, 0, 0, 1), value=1.0)   # a row of ones under v, contiguous

Each is two or three passes over the tensor; the op is one, reading the view where it lies.
Nothing rounds: a ReLU keeps its input's values (ATen's ``clamp_min``: NaN passes, else
``max(v, 0)``), and casting to a wider float is exact. ``contiguous=False`` (no padding) keeps
the layout ``like(x)`` that the cast alone gives (:mod:`sgdiff.kernels.layout`). The reference
implementation *is* the chain.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example, read_first
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def cast_copy_reference(
    x: torch.Tensor,
    dtype: torch.dtype,
    relu: bool,
    pad: list[int],
    value: float,
    contiguous: bool,
) -> torch.Tensor:
    y = aten.relu.default(x) if relu else x
    y = aten._to_copy.default(y, dtype=dtype)
    if any(pad):
        return aten.constant_pad_nd.default(y, list(pad), value)
    if contiguous:
        return aten.clone.default(y, memory_format=torch.contiguous_format)
    return in_layout_of(y, x)


def _sana(which):
    """Sana's linear attention: q or v of one ``[B, S, H D]`` projection, as ``[B, H, D, S]`` views."""
    def make(t):
        x = t.heads()
        return (x, torch.float32, True, [], 0.0, True) if which == "q" else (x, torch.float32, False, [0, 0, 0, 1],
                                                                              1.0, True)
    return make


cast_copy = dispatch.define_op(OpDef(
    "cast_copy", Contract.BITEXACT, cast_copy_reference, impls=(triton("cast_copy"),),
    examples=(
        Example("Sana 1.6B q: relu, fp32, contiguous copy", dict(B=2, S=1024, H=70, D=32), _sana("q"),
                small=dict(S=64, H=3), chain=lambda x, *rest: lambda: torch.relu(x).float().contiguous()),
        Example("Sana 1.6B v: fp32, a row of ones below", dict(B=2, S=1024, H=70, D=32), _sana("v"),
                small=dict(S=64, H=3), moved=read_first,
                chain=lambda x, *rest: lambda: torch.nn.functional.pad(x.float(), (0, 0, 0, 1), value=1.0)),
        Example("q to fp32, contiguous", dict(B=1, S=4608, H=24, D=128),
                lambda t: (t.randn(t.B, t.H, t.S, t.D).transpose(1, 2), torch.float32, False, [0, 0, 0, 0], 0.0, True),
                small=dict(S=64, H=3), bench=False),
    ),
    doc="F.pad((relu(x) if relu else x).to(dtype), pad, value), contiguous or in x's layout",
))
