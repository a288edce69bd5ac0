"""A matmul of a 3-D (or more) tensor by a matrix, batched where eager batches it.

``torch.matmul(x, w)`` with ``x`` [*batch, n, k] and ``w`` [k, p] runs one ``mm`` over
``x.reshape(-1, k)`` where ATen folds the batch into the rows (``should_fold``), else a
``bmm`` over the batch with ``w`` broadcast to it. The two sum each output's k products in
their own kernels, which can round differently. ATen folds only where the first dims' strides
nest (``stride[i] == stride[i + 1] * size[i + 1]`` for each dim but the last two), or where
``w`` requires grad. The decomposition that dynamo traces matmul through skips dims of size 1
in that check, so a slice such as ``latents[:, :1]`` of a [1, tokens, dim] tensor (ConsisID's
face extractor) is folded in the graph where eager batches it: the graph's ``mm`` is not
eager's ``bmm``. This pass puts eager's back: ``x.reshape(batch, n, k)`` (a view or a copy, as
eager's), ``w`` expanded to the batch, ``bmm``, viewed as [*batch, n, p]. Exact: it runs at
every tier, before the families.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import _propagate_meta, rewrite_each
from sgdiff.patterns.base import same_shape, tensor_meta, val

aten = torch.ops.aten

_ROWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def aten_folds(x: torch.Tensor, w: torch.Tensor) -> bool:
    """ATen's ``should_fold`` for ``matmul(x, w)``, x of 3 or more dims, w a matrix."""
    if w.requires_grad or x.numel() == 0:
        return True
    size, stride = x.shape, x.stride()
    return all(stride[i] == stride[i + 1] * size[i + 1] for i in range(x.dim() - 2))


def _folded(mm: fx.Node) -> Optional[tuple]:
    """``(x, w, out)`` where ``mm`` is a matmul of ``x`` by ``w`` folded into rows that eager
    would batch, ``out`` the ``_unsafe_view`` of its result as [*batch, n, p]; else None."""
    rows, w = mm.args
    if not (isinstance(rows, fx.Node) and rows.op == "call_function" and rows.target in _ROWS
            and len(rows.users) == 1 and len(mm.users) == 1):
        return None
    out = next(iter(mm.users))
    x, xv, wv = rows.args[0], tensor_meta(rows.args[0]), tensor_meta(w)
    # the result viewed back by ``_unsafe_view``, as only matmul's own folding does (a model's
    # ``x.reshape(-1, k) @ w`` then ``.view(...)`` is its own mm, eager's too)
    if xv is None or wv is None or xv.dim() < 3 or wv.dim() != 2 or not (
            out.op == "call_function" and out.target is aten._unsafe_view.default):
        return None
    k, p = xv.shape[-1], wv.shape[-1]
    if not (same_shape(val(rows.args[1]), (math.prod(xv.shape[:-1]), k))
            and same_shape(val(out.args[1]), (*xv.shape[:-1], p))):
        return None
    if any(isinstance(s, torch.SymInt) for s in (*xv.shape, *xv.stride())) or aten_folds(xv, wv):
        return None
    return x, w, out


def batch_folded_matmuls(gm: fx.GraphModule) -> int:
    """Give every matmul that the graph folds and eager batches eager's ``bmm``; returns how many."""
    return rewrite_each(gm, aten.mm.default, _folded, _batched,
                        "matmuls folded into rows where eager batches them given eager's bmm")


def _batched(mm: fx.Node, found: tuple) -> bool:
    x, w, out = found
    graph, xv, wv = mm.graph, tensor_meta(x), tensor_meta(w)
    batch, (n, k), p = list(xv.shape[:-2]), xv.shape[-2:], wv.shape[-1]
    b = math.prod(batch)
    with graph.inserting_before(out):
        nodes = [graph.call_function(aten.reshape.default, (x, [b, n, k]))]
        nodes.append(graph.call_function(aten.expand.default, (w, [*batch, k, p])))
        nodes.append(graph.call_function(aten.reshape.default, (nodes[-1], [b, k, p])))
        nodes.append(graph.call_function(aten.bmm.default, (nodes[0], nodes[2])))
        nodes.append(graph.call_function(aten._unsafe_view.default, (nodes[-1], [*batch, n, p])))
    for node in nodes:
        _propagate_meta(node)
    out.replace_all_uses_with(nodes[-1])
    graph.erase_node(out)
    return True
