"""sgdiff::rope_matrix — rotary embedding as a 2x2 rotation table per pair (Kandinsky 5 and 6, PRX,
BFL's original Flux code).

Eager chains, for ``x`` of shape [..., D] and a table broadcast to [..., D/2, 2, 2]::

    sum form (Kandinsky):     x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
                              out = (table * x_).sum(-1).reshape(x.shape).to(dtype)
    select form (PRX, Flux):  x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
                              out = (t[..., 0] * x_[..., 0] + t[..., 1] * x_[..., 1]).reshape(x.shape).type_as(x)

so ``out[2j + i] = t[j, i, 0] * x[2j] + t[j, i, 1] * x[2j + 1]`` (``t = [[cos, -sin], [sin, cos]]``
in the models, but any table is computed as eager computes it). Rounding: each product in fp32,
then their sum in fp32: the sum form's reduction starts from +0 (``(0 + p0) + p1``: a pair of
-0 products sums to +0), the select form adds the two (``p0 + p1``: -0); then the casts the
chain applies, in order (``mid_dtype`` first: Kandinsky 5's fixed ``.to(torch.bfloat16)``
before ``.type_as(q)``). The output has the chain's layout (its reshape and sum leave some
layouts of ``x`` contiguous). The reference implementation *is* that chain, op for op.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import to
from sgdiff.tiers import Contract

aten = torch.ops.aten


def rope_matrix_reference(
    x: torch.Tensor,
    table: torch.Tensor,
    from_zero: bool,
    mid_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    pairs = aten.reshape.default(to(x, torch.float32), list(x.shape[:-1]) + [-1, 1, 2])
    if from_zero:
        rotated = aten.sum.dim_IntList(aten.mul.Tensor(table, pairs), [-1])
    else:
        rotated = aten.add.Tensor(aten.mul.Tensor(aten.select.int(table, -1, 0), aten.select.int(pairs, -1, 0)),
                                  aten.mul.Tensor(aten.select.int(table, -1, 1), aten.select.int(pairs, -1, 1)))
    out = aten.reshape.default(rotated, x.shape)
    for dtype in (mid_dtype, out_dtype):
        if dtype is not None:
            out = to(out, dtype)
    return out


def _kandinsky_chain(x, table, from_zero, mid_dtype=None, out_dtype=None):
    """Kandinsky 6's ``apply_rotary`` (the sum form), or PRX's ``apply_rope`` (the select form)."""
    if from_zero:
        return lambda: (table.float() * x.reshape(*x.shape[:-1], -1, 1, 2).float()).sum(dim=-1).reshape(
            *x.shape).to(dtype=x.dtype)

    def prx():
        x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
        return (table[..., 0] * x_[..., 0] + table[..., 1] * x_[..., 1]).reshape(*x.shape).type_as(x)

    return prx


def _rotation(t, heads: bool):
    """A [1, S, 1 or H, D/2, 2, 2] table [[cos, -sin], [sin, cos]] of random angles."""
    angle = t.randn(1, t.S, t.H if heads else 1, t.D // 2, dtype=torch.float32)
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([cos, -sin, sin, cos], -1).view(*angle.shape, 2, 2)


rope_matrix = dispatch.define_op(OpDef(
    "rope_matrix", Contract.BITEXACT, rope_matrix_reference, impls=(triton("rope"),),
    examples=(
        Example("Kandinsky 6 q, sum form", dict(B=1, S=8192, H=14, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), _rotation(t, False), True, None, torch.bfloat16),
                small=dict(S=64, H=3), chain=_kandinsky_chain),
        Example("PRX q, select form", dict(B=2, S=4096, H=28, D=64),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), _rotation(t, False), False, None, torch.bfloat16),
                small=dict(S=64, H=3), chain=_kandinsky_chain),
        Example("per-head table, heads first x", dict(B=1, S=4096, H=8, D=64),
                lambda t: (t.randn(t.B, t.H, t.S, t.D).transpose(1, 2), _rotation(t, True), True, None,
                           torch.bfloat16),
                small=dict(S=64, H=3), bench=False),
    ),
    doc="out[2j + i] = t[j, i, 0] * x[2j] + t[j, i, 1] * x[2j + 1] in fp32, then the chain's casts",
))
