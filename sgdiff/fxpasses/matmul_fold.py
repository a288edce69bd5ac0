"""A matmul of a 3-D (or more) tensor by a matrix, folded or batched as eager decides.

``torch.matmul(x, w)`` with ``x`` [*batch, n, k] and ``w`` [k, p] runs one ``mm`` over
``x.reshape(-1, k)`` where ATen folds the batch into the rows (``should_fold``), else a
``bmm`` over the batch with ``w`` broadcast to it. The two sum each output's k products in
their own kernels, which can round differently. ATen folds where the first dims' strides nest
(``stride[i] == stride[i + 1] * size[i + 1]`` for each dim but the last two), or where ``w``
requires grad (a parameter, even under ``no_grad``). The decomposition dynamo traces matmul
through skips dims of size 1 in that check, so a slice such as ``latents[:, :1]`` of a [1,
tokens, dim] tensor (ConsisID's face extractor) is folded in the graph where eager, given a
``w`` that requires no grad, batches it; torch 2.14's trace does the reverse (batches that slice,
which its eager folds). Where the graph folded such an ``x``, or batched one in a ``bmm`` that
dynamo recorded as coming from a ``matmul`` or a ``linear`` (``source_fn_stack``: a ``bmm`` the
model wrote stays as it is), this pass calls ``aten.matmul`` itself on the same
tensors: at run time ATen makes eager's choice, ``w``'s ``requires_grad`` included (a fake
tensor does not carry it). Exact: it runs at every tier, before the families.
"""
from __future__ import annotations

import math
import operator
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


def strides_nest_past_ones(x: torch.Tensor) -> bool:
    """The check with x's size-1 dims skipped (torch 2.13's traced decomposition; 2.14's eager)."""
    kept = [(size, stride) for size, stride in zip(x.shape[:-1], x.stride()[:-1]) if size != 1]
    return x.numel() == 0 or all(a[1] == b[1] * b[0] for a, b in zip(kept, kept[1:]))


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


# what calls ATen's matmul on a model's behalf: the operator, torch's and Tensor's, and linear
_MATMULS = (operator.matmul, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
            torch.nn.functional.linear)


def _from_matmul(node: fx.Node) -> bool:
    """Whether dynamo recorded ``node`` as part of a ``matmul`` (or ``linear``) the model called,
    or of an ``nn.Linear``."""
    stack = node.meta.get("source_fn_stack") or ()
    if not stack:
        return False
    fn = stack[-1][1]
    return fn in _MATMULS or (isinstance(fn, type) and issubclass(fn, torch.nn.Linear))


def _single_use(node, target) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target is target
            and len(node.users) == 1)


def _expanded(node, shape) -> Optional[tuple]:
    """``(t, size)`` where ``node`` views as ``shape`` the tensor ``t`` expanded to ``size``:
    ``view(expand(t, size), shape)``, or ``_unsafe_view(clone(expand(t, size)), shape)`` where the
    batch cannot be viewed as one dim (matmul's ``reshape``), each read once; else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in _ROWS
            and len(node.users) == 1 and same_shape(val(node.args[1]), shape)):
        return None
    expand = node.args[0]
    if _single_use(expand, aten.clone.default) and expand.kwargs.get("memory_format") in (
            None, torch.contiguous_format):
        expand = expand.args[0]
    return tuple(expand.args[:2]) if _single_use(expand, aten.expand.default) else None


def _batched(bmm: fx.Node) -> Optional[tuple]:
    """``(x, w, out)`` where ``bmm`` is a model's matmul of ``x`` [*batch, n, k] by a matrix ``w``
    batched in the graph, ``x``'s strides nesting only once its size-1 dims are skipped (torch
    2.14's eager folds it), ``out`` the view of its result as [*batch, n, p]; else None. Strides
    that do not nest either way are batched by eager too (a weight that requires grad, which eager
    folds, is traced as one that does)."""
    a, b = bmm.args
    av, bv = tensor_meta(a), tensor_meta(b)
    if av is None or bv is None or len(bmm.users) != 1 or not _from_matmul(bmm):
        return None
    out, xs, ws = next(iter(bmm.users)), _expanded(a, tuple(av.shape)), _expanded(b, tuple(bv.shape))
    if xs is None or ws is None:
        return None
    (x, x_size), (w, _) = xs, ws
    xv, wv = tensor_meta(x), tensor_meta(w)
    if xv is None or wv is None or xv.dim() < 3 or wv.dim() != 2 or not same_shape(val(x_size), tuple(xv.shape)):
        return None
    if any(isinstance(s, torch.SymInt) for s in (*xv.shape, *xv.stride(), *wv.shape)) or strides_nest(xv) \
            or not strides_nest_past_ones(xv):
        return None
    if not (out.op == "call_function" and out.target in _ROWS
            and same_shape(val(out.args[1]), (*xv.shape[:-1], wv.shape[-1]))):
        return None
    return x, w, out


def restore_matmul_folding(gm: fx.GraphModule) -> int:
    """Give every matmul that the graph folds or batches where eager may do the other to
    ``aten.matmul`` itself; returns how many."""
    return (rewrite_each(gm, aten.mm.default, _folded, _left_to_aten,
                         "matmuls folded where eager may batch them left to ATen's matmul at run time")
            + rewrite_each(gm, aten.bmm.default, _batched, _left_to_aten,
                           "matmuls batched where eager may fold them left to ATen's matmul at run time"))


def _left_to_aten(mm: fx.Node, found: tuple) -> bool:
    x, w, out = found
    graph = mm.graph
    with graph.inserting_before(out):
        matmul = graph.call_function(aten.matmul.default, (x, w))
    _propagate_meta(matmul)
    out.replace_all_uses_with(matmul)
    graph.erase_node(out)
    return True
