"""Projections of one input as one GEMM: the ``sgdiff::linear_fp8`` ops that read the same
tensor (q, k and v of a block's normalized input; Flux single blocks' q, k, v and MLP
projection), all with a bias or all without, become one ``sgdiff::linear_fp8_siblings`` over
their weights side by side, and each one's users read its columns of that output::

    q = linear_fp8(x, wq, bq); k = linear_fp8(x, wk, bk); v = linear_fp8(x, wv, bv)
        -> y = linear_fp8_siblings(x, [wq, wk, wv], [bq, bk, bv])
           q = y[:, 0:Nq]; k = y[:, Nq:Nq + Nk]; v = y[:, Nq + Nk:]

The op's math is each projection's, column by column (per-row and per-channel scales), so the
merge changes no value of the op's contract; the GEMM is launched once and fills the GPU better.
A column slice is strided (its rows ``sum N_i`` apart) where each projection's own output was
contiguous: every value derived from one gets its new fake value, in graph order, until a value
comes out as it was (what reads a view makes its own output). A group where one cannot be made
(a view that flattens a slice's rows) is left as it was, with a log line. Kernels read their
inputs through their strides, or their ``supports`` refuse them and the op's reference runs.

Runs after the families: only ``high`` makes linear_fp8 ops.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import fake_value
from sgdiff.kernels import registry

log = logging.getLogger("sgdiff")
aten = torch.ops.aten


def merge_sibling_projections(gm: fx.GraphModule) -> int:
    """Merge each group of linear_fp8 ops of one input; returns how many groups were merged."""
    single = registry.op_def("linear_fp8").load()
    groups: Dict[tuple, List[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is single and not node.kwargs and len(node.args) == 3:
            groups.setdefault((node.args[0], node.args[2] is None), []).append(node)
    groups = {key: members for key, members in groups.items() if len(members) > 1}
    if not groups:  # every tier but high: no linear_fp8 op
        return 0
    merged_op = registry.op_def("linear_fp8_siblings").load()
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    merged = 0
    for (x, _), members in groups.items():
        if _merge(gm, x, members, order, merged_op):
            merged += 1
    if merged:
        gm.recompile()
        log.debug("sgdiff: %d groups of projections of one input merged into one FP8 GEMM each", merged)
    return merged


def _merge(gm: fx.GraphModule, x: fx.Node, members: List[fx.Node], order: Dict[fx.Node, int], merged_op) -> bool:
    first = min(members, key=order.__getitem__)
    weights = [m.args[1] for m in members]
    biases = [m.args[2] for m in members if m.args[2] is not None]
    late = [a for a in (*weights, *biases) if isinstance(a, fx.Node) and order[a] > order[first]]
    if late:  # an operand made after the first projection: the merged GEMM could not go before it
        log.info("sgdiff: projections of %s not merged: %s is made after the first of them", x.name, late[0].name)
        return False
    with gm.graph.inserting_before(first):
        node = gm.graph.call_function(merged_op, (x, weights, biases))
    try:
        node.meta["val"] = fake_value(node)
        widths = [m.meta["val"].shape[-1] for m in members]
        if not all(isinstance(w, int) for w in widths):
            raise ValueError("a projection's width is symbolic")
        starts = [sum(widths[:i]) for i in range(len(widths))]
        columns = {m: node.meta["val"][:, s:s + w] for m, s, w in zip(members, starts, widths)}
        changed = _derived_values(gm, columns)
    except Exception as exc:  # a value derived from a slice cannot be made: the group stays
        gm.graph.erase_node(node)
        log.info("sgdiff: projections of %s not merged: a value read from their strided columns cannot be made "
                 "(%s: %s)", x.name, type(exc).__name__, str(exc)[:200])
        return False
    for member, start, width in zip(members, starts, widths):
        with gm.graph.inserting_before(member):
            column = gm.graph.call_function(aten.slice.Tensor, (node, 1, start, start + width))
        column.meta["val"] = columns[member]
        member.replace_all_uses_with(column)
        gm.graph.erase_node(member)
    for derived, value in changed.items():
        derived.meta["val"] = value
    return True


def _derived_values(gm: fx.GraphModule, values: Dict[fx.Node, Any]) -> Dict[fx.Node, Any]:
    """The new fake value of every node derived from ``values`` (nodes standing for new values),
    but for those whose value comes out as it was (and what only they feed). Raises what a
    node's target raises on its new inputs."""
    changed = dict(values)
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in changed:
            continue
        if not any(n in changed for n in node.all_input_nodes):
            continue
        value = fake_value(node, lambda n: changed[n] if n in changed else n.meta.get("val"))
        if not _same_layout(value, node.meta.get("val")):
            changed[node] = value
    return {n: v for n, v in changed.items() if n not in values}


def _same_layout(a: Any, b: Any) -> bool:
    """Whether two fake values have the same sizes, strides and dtypes (lists item by item)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    return type(a) is type(b) and not isinstance(a, torch.Tensor)
