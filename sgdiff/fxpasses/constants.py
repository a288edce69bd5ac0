"""Compute a graph's input-independent values once, when it is compiled.

Some DiTs build tables in ``forward`` from sizes alone: EasyAnimate's 3-D RoPE tables
(``get_3d_rotary_pos_embed``: ``linspace``, ``outer``, ``cos`` on the CPU, then copied to the
GPU), HunyuanDiT's, Allegro's. A captured graph of fixed sizes recomputes them on every call:
host time, a pageable host-to-device copy, and a graph CUDA graphs cannot capture ("cannot copy
between CPU and CUDA tensors during capture"). Here the nodes that depend on no graph input
(placeholders, symbolic sizes included) and draw no random numbers are run once, and each value
the rest of the graph reads from them becomes a constant of the graph module (taken before the
views it is read through, which stay: a RoPE chain still selects its table's entries). The ops are the
ones eager runs, on the same devices, so the values are eager's bit for bit; a call then reads
them where eager would have made them.

Not folded: values from ``empty``-like ops (their bytes are whatever memory held), random ops,
ops with side effects or that write into an argument, and folds whose constants would hold more than :data:`MAX_BYTES`
(memory held for the graph's lifetime, where eager holds it for a call).
"""
from __future__ import annotations

import functools
import logging
import operator
from typing import Dict, List, Set

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.fxpasses.copies import op_output

log = logging.getLogger("sgdiff")

aten = torch.ops.aten

#: the most bytes a graph's folded constants may hold
MAX_BYTES = 256 << 20
#: ops whose output bytes are not a function of their arguments
UNINITIALIZED = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                 aten.new_empty.default, aten.new_empty_strided.default}


def _foldable(node: fx.Node, const: Set[fx.Node]) -> bool:
    if node.op == "get_attr":
        return True
    if node.op == "call_function" and node.target is operator.getitem:  # an item of a split
        return all(n in const for n in node.all_input_nodes)
    if node.op != "call_function" or not _compat.is_op_overload(node.target):
        return False
    if node.target in UNINITIALIZED or node.is_impure() or node.target._schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    return all(n in const for n in node.all_input_nodes)


def _is_view(node: fx.Node) -> bool:
    """An op whose output aliases its (first) input: ``view``, ``select``, ``unsqueeze``, ``expand``..."""
    return op_output(node)[1] and bool(node.args) and isinstance(node.args[0], fx.Node)


def _tensors(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def fold_constants(gm: fx.GraphModule) -> int:
    """Fold ``gm``'s input-independent values into constants; returns how many values the
    rest of the graph now reads as constants (0: the graph is unchanged)."""
    const: Set[fx.Node] = set()
    for node in gm.graph.nodes:
        if _foldable(node, const):
            const.add(node)
    # the values the rest of the graph reads, each taken at the last op before the views it is read
    # through (the views stay, reading the constant: the chains the families match see them)
    boundary = set()
    for node in const:
        if node.op == "call_function" and any(u not in const for u in node.users):
            while _is_view(node) and node.args[0] in const:
                node = node.args[0]
            if node.op == "call_function":
                boundary.add(node)
    # a value the graph returns stays a fresh tensor per call, as eager's is
    boundary = [n for n in boundary if all(u.op != "output" for u in n.users)]
    if not boundary:
        return 0
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    boundary.sort(key=order.get)
    values: Dict[fx.Node, object] = {}
    try:
        with _compat.real_tensors():
            for node in gm.graph.nodes:
                if node not in const:
                    continue
                if node.op == "get_attr":
                    values[node] = functools.reduce(getattr, node.target.split("."), gm)
                    continue
                args, kwargs = fx.map_arg((node.args, node.kwargs), values.__getitem__)
                values[node] = node.target(*args, **kwargs)
    except Exception as exc:  # a value that cannot be computed ahead: the graph stays as it is
        log.info("sgdiff: input-independent values left to each call (%s: %s)", type(exc).__name__, exc)
        return 0
    held = sum(t.untyped_storage().nbytes() for n in boundary for t in _tensors(values[n]))
    if held > MAX_BYTES:
        log.info("sgdiff: input-independent values left to each call (%d MiB, more than %d MiB)",
                 held >> 20, MAX_BYTES >> 20)
        return 0
    folded = 0
    for i, node in enumerate(boundary):
        if not isinstance(values[node], torch.Tensor):  # a tuple (split, unbind): its items are read
            continue
        name = f"_sgdiff_constant{i}"
        gm.register_buffer(name, values[node], persistent=False)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
        log.debug("sgdiff: %d input-independent values computed once (%.1f MiB)", folded, held / 2**20)
    return folded
