"""Sums read only as modulation operands are never made: the ops read both addends.

A per-token adaLN (a timestep per token: Wan 2.2's TI2V model) spells its modulation as one
sum sliced six ways::

    mods = table.unsqueeze(0) + temb.float()      # [B, S, 6, D] fp32: the sum in memory
    shift, scale, gate, ... = mods.chunk(6, dim=2) # then .squeeze(2): [B, S, D] views

and every slice is then an operand of a rewritten chain (a LayerNorm-modulate's scale or
shift, a gated residual's gate). An op that declares addends (``OpDef.addends``) can take the
two tensors instead and sum them in registers, promoted and rounded once as eager's add: an
elementwise sum sliced is the sum of the slices. Where *every* reader of such an ``add``
(through views: slices, selects, squeezes, splits, permutes) is an operand that takes an
addend, each operand becomes the same views of the add's first tensor (expanded to the sum's
shape) and its addend the same views of the second; the sum is then dead, and so is a
``_to_copy`` that widened a 16-bit addend for it alone (the kernel widens on load: the
promotion gives the same fp32 sum). A sum something else reads stays as it is: folding it
would save nothing; so does a sum without a row per token (a ``[B, 6, D]`` table sum: storing
it costs nothing, and the ops' fastest kernels read one tensor). Graphs with
symbolic sizes are left alone (the expand would need them).
"""
from __future__ import annotations

import inspect
import logging
import operator
from typing import Dict, List, Optional, Tuple

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import _is_symbolic, _propagate_meta, settle
from sgdiff.kernels import registry
from sgdiff.patterns import parts
from sgdiff.patterns.base import tensor_meta
from sgdiff.patterns.matcher import Arg, Match

log = logging.getLogger("sgdiff")
aten = torch.ops.aten

#: ops whose output is a view of their first argument (or, for splits, a list of views)
VIEWS = {aten.slice.Tensor, aten.select.int, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
         aten.permute.default, aten.transpose.int, aten.expand.default, aten.alias.default, aten.squeeze.default,
         aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, operator.getitem}


def _ops_with_addends() -> Dict[object, Tuple[List[inspect.Parameter], Dict[str, str]]]:
    """op overload -> (its reference's parameters, operand -> addend parameter)."""
    found = {}
    for op in registry.ops():
        if not op.addends or op.reference is None:
            continue
        try:
            found[op.load()] = (list(inspect.signature(op.reference).parameters.values()), dict(op.addends))
        except (ImportError, AttributeError):
            continue
    return found


def _is_view(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in VIEWS and bool(node.args) and isinstance(node.args[0], fx.Node)


def _readers(source: fx.Node, ops) -> Optional[List[Tuple[fx.Node, str, List[fx.Node]]]]:
    """Every ``(op node, operand, view chain)`` through which ``source`` is read, if each read
    is an operand that takes an addend (not yet given); else None."""
    found, stack = [], [(source, [])]
    while stack:
        node, chain = stack.pop()
        for user in node.users:
            if _is_view(user) and user.args[0] is node:
                stack.append((user, chain + [user]))
                continue
            if user.op != "call_function" or user.target not in ops or user.kwargs:
                return None
            if not _per_token(tensor_meta(node), tensor_meta(user)):  # a sum smaller than the rows it modulates
                return None
            names, addends = [p.name for p in ops[user.target][0]], ops[user.target][1]
            positions = [i for i, a in enumerate(user.args) if a is node]
            for i in positions:
                operand = names[i] if i < len(names) else None
                addend = addends.get(operand)
                j = names.index(addend) if addend is not None else None
                if addend is None or (j < len(user.args) and user.args[j] is not None):
                    return None
                found.append((user, operand, chain))
            if not positions:
                return None
    return found


def _per_token(operand: Optional[torch.Tensor], out: Optional[torch.Tensor]) -> bool:
    """Whether ``operand`` has a row per token of ``out`` (more than one token a batch entry)."""
    return (operand is not None and out is not None and operand.dim() >= 2 and out.dim() >= 2
            and operand.shape[-2] == out.shape[-2] > 1)


WIDENED = parts.cast(Arg("src"), "widened")


def _widened(node: fx.Node, dtype: torch.dtype) -> fx.Node:
    """The narrower float tensor ``node`` widens to ``dtype`` for this sum alone, else ``node``."""
    for m in WIDENED.matches(node, Match(root=node)):
        src = tensor_meta(m["src"])
        if (parts.cast_dtype(m, "widened") == dtype and len(node.users) == 1 and src is not None
                and src.is_floating_point() and src.element_size() <= torch.empty((), dtype=dtype).element_size()):
            return m["src"]
    return node


def _operands(add: fx.Node) -> Optional[Tuple[fx.Node, fx.Node]]:
    """The two tensors the op may take for ``add``'s output, in its order, or None."""
    if add.op != "call_function" or add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs:
        return None
    out, (a, b) = tensor_meta(add), add.args
    if out is None or tensor_meta(a) is None or tensor_meta(b) is None or not out.is_floating_point() or _is_symbolic(out):
        return None
    if any(_is_symbolic(tensor_meta(n)) or tensor_meta(n).device != out.device for n in (a, b)):
        return None
    a2, b2 = _widened(a, out.dtype), _widened(b, out.dtype)
    for first, second in ((a2, b2), (a2, b), (a, b2), (a, b)):
        if torch.promote_types(tensor_meta(first).dtype, tensor_meta(second).dtype) == out.dtype:
            return first, second
    return None


def _replay(graph: fx.Graph, base: fx.Node, shape, chain: List[fx.Node]) -> fx.Node:
    """``chain`` (views of the sum, outermost last) applied to ``base`` expanded to ``shape``."""
    node = base
    if tuple(tensor_meta(base).shape) != tuple(shape):
        node = graph.call_function(aten.expand.default, (base, list(shape)))
        _propagate_meta(node)
    for view in chain:
        node = graph.call_function(view.target, (node, *view.args[1:]), dict(view.kwargs))
        _propagate_meta(node)
    return node


def fold_addends(gm: fx.GraphModule) -> int:
    """Fold every such sum of ``gm`` into the ops that read it (in place); returns how many."""
    ops = _ops_with_addends()
    if not ops:
        return 0
    graph, folded = gm.graph, 0
    for add in list(graph.nodes):
        pair = _operands(add) if add.op == "call_function" and add.target is aten.add.Tensor else None
        readers = _readers(add, ops) if pair is not None else None
        if not readers:
            continue
        shape = tensor_meta(add).shape
        for op_node, operand, chain in readers:
            params, addends = ops[op_node.target]
            names = [p.name for p in params]
            with graph.inserting_before(op_node):
                first, second = (_replay(graph, n, shape, chain) for n in pair)
            j = names.index(addends[operand])
            args = list(op_node.args) + [p.default for p in params[len(op_node.args):j + 1]]
            args[names.index(operand)], args[j] = first, second
            op_node.args = tuple(args)
        folded += 1
    if folded:
        settle(gm)
        log.info("sgdiff: %d sums read only as modulation operands are summed by their ops (never stored)", folded)
    return folded
