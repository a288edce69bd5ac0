"""sgdiff::linear_attention_out — a linear attention's output: each column divided by its last
row, heads joined, tokens first, cast back to the model's dtype.

Eager chain (Sana's ``SanaLinearAttnProcessor2_0``; ``h`` is ``matmul(scores, q)`` in fp32,
[B, heads, head_dim + 1, tokens], its last row the normalizer from v's row of ones)::

    y = h[:, :, :-1] / (h[:, :, -1:] + eps)     # fp32 sum, then IEEE division
    y = y.flatten(1, 2).transpose(1, 2)          # [B, tokens, heads * head_dim], a view
    y = y.to(dtype)                              # rounded once, in that view's layout

Three passes in eager (the add is tiny); one here. The output keeps the transposed layout the
cast gives, so the projection after it reads what it read before. The reference implementation
*is* the chain.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example, read_first
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_attention_out_reference(
    h: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    B, H, R, N = h.shape
    num = aten.slice.Tensor(h, 2, 0, -1)
    den = aten.add.Tensor(aten.slice.Tensor(h, 2, -1, R), eps)
    y = aten.view.default(aten.div.Tensor(num, den), [B, H * (R - 1), N])
    return aten._to_copy.default(aten.transpose.int(y, 1, 2), dtype=dtype)


def _sana_chain(h, eps, dtype):
    return lambda: (h[:, :, :-1] / (h[:, :, -1:] + eps)).flatten(1, 2).transpose(1, 2).to(dtype)


linear_attention_out = dispatch.define_op(OpDef(
    "linear_attention_out", Contract.BITEXACT, linear_attention_out_reference, impls=(triton("linear_attention_out"),),
    examples=(
        Example("Sana 1.6B output: / last row, heads joined, tokens first, bf16", dict(B=2, H=70, D=32, S=1024),
                lambda t: (t.randn(t.B, t.H, t.D + 1, t.S, dtype=torch.float32, scale=50), 1e-15, torch.bfloat16),
                small=dict(S=64), moved=read_first, chain=_sana_chain),
    ),
    doc="(h[:, :, :-1] / (h[:, :, -1:] + eps)).flatten(1, 2).transpose(1, 2).to(dtype)",
))
