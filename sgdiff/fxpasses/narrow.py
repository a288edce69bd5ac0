"""Elementwise ops spelled through fp32 and back are the 16-bit ops: ``(a.float() * b.float()).to(a.dtype)``.

ATen computes a bf16 or fp16 ``mul``, ``add`` or ``sub`` of two tensors of that dtype in fp32
(its opmath type) and rounds the result once to that dtype. Widening both operands first
(exact), doing the op in fp32 and rounding the fp32 result to the same dtype is that
computation, step for step: the same fp32 operation on the same fp32 values, then the same
rounding. So a model that writes its gated residual as ``residual + (gate.float() *
y.float()).to(x.dtype)`` (ERNIE-Image) computes ``residual + gate * y`` bit for bit; this pass
rewrites the spelling so that the families see the chain they know. The operands must share the
16-bit dtype the result is rounded to; ``add``/``sub`` take alpha 1 only. Exact: it runs at
every tier, before the families.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import _propagate_meta, rewrite_each
from sgdiff.patterns import parts
from sgdiff.patterns.base import tensor_meta
from sgdiff.patterns.matcher import AnyOf, Arg, Lit, Match, Op

aten = torch.ops.aten


def _widened(name: str):
    return parts.cast(Arg(name), f"{name}_widened", shared=True)


#: ``op(a.float(), b.float()).to(dtype)``: the op node bound as ``op``, the final cast as the root
SPELLING = parts.cast(AnyOf(Op(aten.mul.Tensor, _widened("a"), _widened("b"), name="op", shared=True),
                            *(Op(target, _widened("a"), _widened("b"), alpha=Lit(1), name="op", shared=True)
                              for target in (aten.add.Tensor, aten.sub.Tensor))), "narrowed")


def _narrowed(node: fx.Node) -> Optional[Match]:
    """The match where ``node`` rounds ``op(a.float(), b.float())`` back to a's and b's 16-bit
    dtype, else None."""
    for m in SPELLING.matches(node, Match(root=node)):
        a, b, op = tensor_meta(m["a"]), tensor_meta(m["b"]), tensor_meta(m["op"])
        half = parts.cast_dtype(m, "narrowed")
        if (a is not None and b is not None and op is not None and half in parts.HALF and a.dtype == b.dtype == half
                and op.dtype == torch.float32 and parts.cast_dtype(m, "a_widened") == torch.float32
                and parts.cast_dtype(m, "b_widened") == torch.float32):
            return m
    return None


def narrow_elementwise(gm: fx.GraphModule) -> int:
    """Rewrite every such spelling of ``gm`` as the 16-bit op (in place); returns how many."""
    return rewrite_each(gm, aten._to_copy.default, _narrowed, _narrow,
                        "elementwise ops through fp32 and back written as the 16-bit op")


def _narrow(node: fx.Node, m: Match) -> bool:
    graph = node.graph
    with graph.inserting_before(node):
        narrow = graph.call_function(m["op"].target, (m["a"], m["b"]))
    narrow.meta.update({k: v for k, v in node.meta.items() if k != "val"})
    _propagate_meta(narrow)
    out, want = tensor_meta(narrow), tensor_meta(node)
    if out is None or out.dtype != want.dtype or tuple(out.shape) != tuple(want.shape):
        graph.erase_node(narrow)
        return False
    node.replace_all_uses_with(narrow)
    graph.erase_node(node)
    return True
