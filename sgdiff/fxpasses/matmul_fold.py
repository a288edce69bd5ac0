"""A matmul of a 3-D (or more) tensor by a matrix, folded or batched as eager decides.

``torch.matmul(x, w)`` with ``x`` [*batch, n, k] and ``w`` [k, p] runs one ``mm`` over
``x.reshape(-1, k)`` where ATen folds the batch into the rows (``should_fold``), else a
``bmm`` over the batch with ``w`` broadcast to it. The two sum each output's k products in
their own kernels, which can round differently. ATen folds where the first dims' strides nest
(``stride[i] == stride[i + 1] * size[i + 1]`` for each dim but the last two), or where ``w``
requires grad (a parameter, even under ``no_grad``). The decomposition dynamo traces matmul
through skips dims of size 1 in that check, so a slice such as ``latents[:, :1]`` of a [1,
tokens, dim] tensor (ConsisID's face extractor) is folded in the graph where eager, given a
``w`` that requires no grad, batches it. Where the graph folded such an ``x``, this pass calls
``aten.matmul`` itself on the same tensors: at run time ATen makes eager's choice, ``w``'s
``requires_grad`` included (a fake tensor does not carry it). Exact: it runs at every tier,
before the families.
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


def strides_nest(x: torch.Tensor) -> bool:
    """ATen's ``should_fold`` for ``matmul(x, w)``, x of 3 or more dims, w a matrix that
    requires no grad: x empty, or its first dims' strides nesting."""
    if x.numel() == 0:
        return True
    size, stride = x.shape, x.stride()
    return all(stride[i] == stride[i + 1] * size[i + 1] for i in range(x.dim() - 2))


def _folded(mm: fx.Node) -> Optional[tuple]:
    """``(x, w, out)`` where ``mm`` is a matmul of ``x`` by ``w`` folded into rows where eager
    batches them unless ``w`` requires grad, ``out`` the ``_unsafe_view`` of its result as
    [*batch, n, p]; else None."""
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
    if any(isinstance(s, torch.SymInt) for s in (*xv.shape, *xv.stride())) or strides_nest(xv):
        return None
    return x, w, out


def restore_matmul_folding(gm: fx.GraphModule) -> int:
    """Give every matmul that the graph folds where eager may batch it to ``aten.matmul`` itself;
    returns how many."""
    return rewrite_each(gm, aten.mm.default, _folded, _left_to_aten,
                        "matmuls folded where eager may batch them left to ATen's matmul at run time")


def _left_to_aten(mm: fx.Node, found: tuple) -> bool:
    x, w, out = found
    graph = mm.graph
    with graph.inserting_before(out):
        matmul = graph.call_function(aten.matmul.default, (x, w))
    _propagate_meta(matmul)
    out.replace_all_uses_with(matmul)
    graph.erase_node(out)
    return True
