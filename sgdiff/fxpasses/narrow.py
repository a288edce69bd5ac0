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

import logging
from typing import Optional

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import _propagate_meta, settle

log = logging.getLogger("sgdiff")
aten = torch.ops.aten

OPS = (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor)
HALF = (torch.bfloat16, torch.float16)


def _dtype(node) -> Optional[torch.dtype]:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v.dtype if isinstance(v, torch.Tensor) else None


def is_cast(node, dtype: torch.dtype) -> bool:
    """Whether ``node`` is ``_to_copy(x, dtype=dtype)`` and nothing more (layout kept, same device)."""
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target is aten._to_copy.default
            and len(node.args) == 1 and node.kwargs.get("dtype") == dtype
            and set(node.kwargs) <= {"dtype", "layout"} and node.kwargs.get("layout", torch.strided) == torch.strided)


def _narrowed(node: fx.Node) -> Optional[tuple]:
    """``(op, a, b, kwargs)`` where ``node`` rounds ``op(a.float(), b.float())`` back to a's and b's
    16-bit dtype, else None."""
    half = node.kwargs.get("dtype")
    if half not in HALF or not is_cast(node, half) or _dtype(node.args[0]) != torch.float32:
        return None
    op_node = node.args[0]
    if op_node.op != "call_function" or op_node.target not in OPS or len(op_node.args) != 2:
        return None
    if set(op_node.kwargs) - {"alpha"} or op_node.kwargs.get("alpha", 1) != 1:
        return None
    if not all(is_cast(a, torch.float32) and _dtype(a.args[0]) == half for a in op_node.args):
        return None
    return op_node.target, op_node.args[0].args[0], op_node.args[1].args[0]


def narrow_elementwise(gm: fx.GraphModule) -> int:
    """Rewrite every such spelling of ``gm`` as the 16-bit op (in place); returns how many."""
    graph, count = gm.graph, 0
    for node in list(graph.nodes):
        found = _narrowed(node) if node.op == "call_function" and node.target is aten._to_copy.default else None
        if found is None:
            continue
        op, a, b = found
        with graph.inserting_before(node):
            narrow = graph.call_function(op, (a, b))
        narrow.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        _propagate_meta(narrow)
        if _dtype(narrow) != node.kwargs["dtype"] or tuple(narrow.meta["val"].shape) != tuple(node.meta["val"].shape):
            graph.erase_node(narrow)
            continue
        node.replace_all_uses_with(narrow)
        graph.erase_node(node)
        count += 1
    if count:
        settle(gm)
        log.debug("sgdiff: %d elementwise ops through fp32 and back written as the 16-bit op", count)
    return count
