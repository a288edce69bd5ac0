"""sgdiff::linear_attention_scores — a linear attention's first matmul, ``pad(v) @ relu(k)``, with
its operands read where they lie.

Eager chain (Sana's ``SanaLinearAttnProcessor2_0``; ``v`` the [B, heads, head_dim, tokens] view
of the value projection, ``k`` the [B, heads, tokens, head_dim] view of the key projection)::

    vp = F.pad(v.float(), (0, 0, 0, 1), value=1.0)   # a row of ones: the normalizer's weights
    kf = relu(k).float()                             # exact
    scores = bmm(vp.view(B * heads, head_dim + 1, tokens),
                 kf.contiguous().view(B * heads, tokens, head_dim))   # cuBLAS, fp32

Eager writes vp and kf (fp32, twice their bytes each) and reads them back; here v and k are read
once and the [B * heads, head_dim + 1, head_dim] scores written. Each score is one fp32
accumulator over the tokens' products; cuBLAS's fp32 kernels for these shapes run no split-K,
so its bits are those of the products summed in increasing token order, each a fused
multiply-add (verified at first sight, like every op). The reference implementation below is the
chain as the graph ran it before this op: v's padded copy and k's copy through :mod:`.cast_copy`
(its eager chain's bits), the matmul through ATen. First sight times the kernel against it and
keeps the faster, so that where the kernel is not taken nothing runs slower than before.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.cast_copy import cast_copy
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_attention_scores_reference(
    v: torch.Tensor,
    k: torch.Tensor,
    value: float,
) -> torch.Tensor:
    B, H, D, N = v.shape
    vp = aten.view.default(cast_copy(v, torch.float32, False, [0, 0, 0, 1], value, True), [B * H, D + 1, N])
    kf = aten._unsafe_view.default(cast_copy(k, torch.float32, True, [], 0.0, True), [B * H, N, D])
    return aten.bmm.default(vp, kf)


def _sana_chain(v, k, value):
    B, H, D, N = v.shape
    return lambda: torch.matmul(torch.nn.functional.pad(v.float(), (0, 0, 0, 1), value=value),
                                torch.relu(k).float()).view(B * H, D + 1, D)


def _sana(t):
    """Sana's v and k: [B, heads, head_dim, tokens] and [B, heads, tokens, head_dim] views of projections."""
    return t.heads(), t.heads().transpose(2, 3), 1.0


linear_attention_scores = dispatch.define_op(OpDef(
    "linear_attention_scores", Contract.BITEXACT, linear_attention_scores_reference,
    impls=(triton("linear_attention_scores"),),
    examples=(
        Example("Sana 1.6B: pad(v.float(), ones) @ relu(k).float()", dict(B=2, H=70, D=32, S=1024), _sana,
                small=dict(S=64, H=4), moved=lambda args, out: [args[0], args[1]], chain=_sana_chain),
    ),
    # first sight times the kernel against the former graph's ops (its reference) and keeps the faster
    tuned=True,
    doc="bmm(pad(v.float(), (0, 0, 0, 1), value).view(B * H, D + 1, N), relu(k).float().contiguous()"
        ".view(B * H, N, D))",
))
