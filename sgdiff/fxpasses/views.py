"""Merge views taken twice: the same view op with the same arguments of the same tensor is
one value, so it becomes one node.

A chain that reads one view of a tensor in two places may take it anew for each (Helios's
RoPE slices ``cos[..., 0::2]`` once for each of its two products, where Wan's names the slice
once); a pattern binds an operand to one node, and would not see the chain. Two such views
alias the same elements with the same sizes and strides, so every read or write through one is
the same through the other: the later node's users read the first, and the later node goes.
Only ops whose schema says their one output aliases an input are merged (views cost nothing,
so the graph's work is unchanged), and only in a graph without in-place ops but the copies back
into its inputs that close a functionalized graph: an in-place op could change one view's sizes
(``unsqueeze_``) or its base's storage (``set_``) between the two.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.fxpasses.copies import op_output

log = logging.getLogger("sgdiff")
aten = torch.ops.aten


def argument_key(value: Any) -> Optional[Any]:
    """A hashable stand-in for a node's arguments (nodes by identity, numbers with their type,
    lists as tuples), or None where one is not hashable (a symbolic size outside a node)."""
    if isinstance(value, (list, tuple)):
        items = tuple(argument_key(v) for v in value)
        return None if any(i is None and v is not None for i, v in zip(items, value)) else (type(value), items)
    if isinstance(value, dict):
        return argument_key(sorted(value.items(), key=lambda kv: kv[0]))
    try:
        hash(value)
    except TypeError:
        return None
    return value if isinstance(value, fx.Node) else (type(value), value)  # 2 is not 2.0, nor True


def mutates_in_place(node: fx.Node) -> bool:
    """Whether ``node`` is an in-place op other than a copy back into a graph input."""
    schema = _compat.op_schema(node.target) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return False
    return not (node.target is aten.copy_.default and node.args[0].op == "placeholder")


def merge_same_views(gm: fx.GraphModule) -> int:
    """Make each view op taken twice with the same arguments one node; returns how many went."""
    if any(mutates_in_place(n) for n in gm.graph.nodes):
        log.debug("sgdiff: views not merged: the graph mutates a tensor in place")
        return 0
    first: Dict[Any, fx.Node] = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not op_output(node)[1]:
            continue
        args, kwargs = argument_key(node.args), argument_key(node.kwargs)
        if args is None or kwargs is None:
            continue
        seen = first.setdefault((node.target, args, kwargs), node)
        if seen is not node:
            node.replace_all_uses_with(seen)
            gm.graph.erase_node(node)
            merged += 1
    if merged:
        gm.recompile()
        log.debug("sgdiff: %d views taken twice merged", merged)
    return merged
