"""sgdiff::linear_attention_apply — a linear attention applied to its queries and normalized:
the second matmul and the output in one pass, q read where it lies.

Eager chain (Sana's ``SanaLinearAttnProcessor2_0``; ``scores = matmul(pad(v), k)`` in fp32,
[B * heads, head_dim + 1, head_dim], its last row the normalizer's weights from v's row of
ones; ``q`` the [B, heads, head_dim, tokens] view of the query projection)::

    qf = relu(q).float()                          # exact
    h = bmm(scores, qf.contiguous().view(B * heads, head_dim, tokens))   # cuBLAS, fp32
    y = h[:, :-1] / (h[:, -1:] + eps)             # linear_attention_out's chain
    y = y.view(B, heads * head_dim, tokens).transpose(1, 2).to(dtype)

Eager writes qf (fp32, twice q's bytes), h (fp32) and reads both back; here q is read once and
y written once. Each element of h is one fp32 accumulator over head_dim products; cuBLAS's
fp32 kernels for these shapes run no split-K, so h's bits are those of the products summed in
increasing k, each a fused multiply-add (verified at first sight, like every op). The reference
implementation below is the chain as the graph ran it before this op: q's copy and the output
through their own ops (:mod:`.cast_copy`, :mod:`.linear_attention_out`; each computes its eager
chain's bits, verified against it), the matmul through ATen. First sight times the kernel
against it and keeps the faster; where the kernel is not taken (other inputs, bits found
different, or slower), that is what runs, no slower than before.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.cast_copy import cast_copy
from sgdiff.kernels.linear_attention_out import linear_attention_out, linear_attention_out_reference
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def linear_attention_apply_reference(
    scores: torch.Tensor,
    q: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    B, H, D, N = q.shape
    qf = cast_copy(q, torch.float32, True, [], 0.0, True)  # relu(q).float(), copied contiguous
    qf = aten._unsafe_view.default(qf, [B * H, D, N])
    h = aten.view.default(aten.bmm.default(scores, qf), [B, H, scores.shape[1], N])
    return linear_attention_out(h, eps, dtype)


def _sana_chain(scores, q, eps, dtype):
    B, H, D, N = q.shape
    return lambda: linear_attention_out_reference(
        torch.matmul(scores.view(B, H, D + 1, D), torch.relu(q).float()), eps, dtype)


def _sana(t):
    """Sana's operands: k and v from ReLU'd and padded projections, q the transposed view."""
    B, H, D, S = t.B, t.H, t.D, t.S
    k = torch.relu(t.randn(B * H, S, D, dtype=torch.float32))
    v = torch.cat([t.randn(B * H, D, S, dtype=torch.float32), torch.ones(B * H, 1, S, device=t.device)], 1)
    scores = torch.bmm(v, k)  # [B * H, D + 1, D]
    return scores, t.heads(), 1e-15, torch.bfloat16


linear_attention_apply = dispatch.define_op(OpDef(
    "linear_attention_apply", Contract.BITEXACT, linear_attention_apply_reference,
    impls=(triton("linear_attention_apply"),),
    examples=(
        Example("Sana 1.6B: bmm(scores, relu(q).float()) normalized, heads joined, bf16", dict(B=2, H=70, D=32, S=1024),
                _sana, small=dict(S=64, H=4), moved=lambda args, out: [args[1], out], chain=_sana_chain),
    ),
    # first sight times the kernel against the former graph's ops (its reference) and keeps the faster
    tuned=True,
    doc="linear_attention_out(bmm(scores, relu(q).float().contiguous().view(B * H, D, N)).view(B, H, D + 1, N), "
        "eps, dtype)",
))
