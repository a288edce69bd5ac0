"""Merge computations made twice: the same deterministic op with the same arguments gives the
same bits, so a chain computed twice from the same tensors is kept once.

A model may compute one value twice (Cosmos 3 rotates the text keys with the same RoPE once for
its causal pathway and once for the generation pathway's keys, one tensor under two names). The
two chains share their first views (:func:`sgdiff.fxpasses.views.merge_same_views` merges
them), so each chain's intermediate has a user in the other and no pattern takes either. Here
each node is named by its op and its arguments' names, the nodes a duplicate reads named as the
first computation's; a duplicate whose result leaves the duplicated chain (a *frontier* node)
hands its users the first computation's result, and the duplicated chain, unread, goes.

Exact: only ops that are deterministic functions of their arguments merge (not random ones,
nor those that allocate memory they leave unset, nor in-place ops: a graph holding one, but for
the copies back into its inputs that close a functionalized graph, is left as it is). Memory:
a frontier merges only where the first result is still alive when the duplicate is made (read
there or later), so no tensor lives longer than one of the two did: the duplicate's memory is
saved. Where it is not, the duplicate stays (a value recomputed far from its first use).
"""
from __future__ import annotations

import logging
import operator
from typing import Dict

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.fxpasses.views import argument_key, mutates_in_place

log = logging.getLogger("sgdiff")
aten = torch.ops.aten

#: ops whose output is not a function of their arguments: memory left unset
UNSET = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}
RANDOM_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise)


def _deterministic(node: fx.Node) -> bool:
    """Whether ``node`` computes the same value from the same arguments every time."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    if not _compat.is_op_overload(node.target):
        return False
    schema = _compat.op_schema(node.target)
    if schema is None or schema.is_mutable or not schema.returns:
        return False
    if schema.name.split("::")[-1] in UNSET:
        return False
    return not any(tag in node.target.tags for tag in RANDOM_TAGS)


def merge_repeated(gm: fx.GraphModule) -> int:
    """Give the users of each computation made twice the first one's result; returns how many
    results were handed over (the duplicated chains that no longer have a reader go)."""
    nodes = list(gm.graph.nodes)
    if any(mutates_in_place(n) for n in nodes):
        log.debug("sgdiff: repeated computations not merged: the graph mutates a tensor in place")
        return 0
    order = {n: i for i, n in enumerate(nodes)}
    same: Dict[fx.Node, fx.Node] = {}  # a node -> the first node computing its value
    first: Dict[tuple, fx.Node] = {}
    for node in nodes:
        same[node] = node
        if not _deterministic(node):
            continue
        args = argument_key(fx.node.map_arg(node.args, lambda n: same[n]))
        kwargs = argument_key(fx.node.map_arg(node.kwargs, lambda n: same[n]))
        if args is not None and kwargs is not None:
            same[node] = first.setdefault((node.target, args, kwargs), node)
    merged = 0
    for node in nodes:
        original = same[node]
        if original is node:
            continue
        readers = [u for u in node.users if same[u] is u]
        alive = max((order[u] for u in original.users), default=-1) >= order[node]
        if readers and alive:
            for u in readers:
                u.replace_input_with(node, original)
            merged += 1
    for node in reversed(nodes):  # the duplicated chains, unread now
        if same[node] is not node and not node.users:
            gm.graph.erase_node(node)
    if merged:
        gm.recompile()
        log.debug("sgdiff: %d repeated computations merged", merged)
    return merged
