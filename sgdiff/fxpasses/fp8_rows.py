"""A LayerNorm-modulate read only by FP8 projections becomes one op with them, which makes its rows
e4m3 as it computes them (``high``)::

    h = layernorm_modulate(x, ...); rows = h.view(-1, D)
    y = linear_fp8_siblings(rows, [w...], [b...])     (or linear_fp8(rows, w, b))
        -> y = layernorm_modulate_linear_fp8(x, ..., [w...], [b...])

The new op's output is the projections' (the same shape and layout), so what reads ``y`` is
unchanged; the LayerNorm-modulate's output, read by nothing else, is never made. Only views lie
between the two (each read only by the next), and the GEMM reads the rows the LayerNorm-modulate
makes, its leading dims flattened. Runs after :mod:`sgdiff.fxpasses.siblings`, whose merged
projections it takes whole. Where the op's kernel does not take a call's inputs (a channels-first
``x``), the op runs the two ops it replaced.
"""
from __future__ import annotations

import logging

import torch
from torch import fx

from sgdiff.fxpasses.rewrite import fake_value
from sgdiff.kernels import registry

log = logging.getLogger("sgdiff")
aten = torch.ops.aten

VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
NORM_DEFAULTS = (True, None, None, None, None)  # scale_plus_one, x_dtype, out_dtype, scale_addend, shift_addend


def fold_norms_into_fp8_rows(gm: fx.GraphModule) -> int:
    """Rewrite each such pair; returns how many."""
    norm, single, siblings, fused = (registry.op_def(n).load() for n in (
        "layernorm_modulate", "linear_fp8", "linear_fp8_siblings", "layernorm_modulate_linear_fp8"))
    folded = 0
    for gemm in list(gm.graph.nodes):
        if gemm.op != "call_function" or gemm.target not in (single, siblings) or gemm.kwargs:
            continue
        chain, source = _views_up(gemm.args[0])
        if source is None or source.target is not norm or source.kwargs or len(source.users) != 1:
            continue
        rows = gemm.args[0].meta.get("val")
        if not isinstance(rows, torch.Tensor) or not rows.is_contiguous():  # the rows as the norm lays them
            continue
        weights, biases = ([gemm.args[1]], [gemm.args[2]] if gemm.args[2] is not None else []) \
            if gemm.target is single else (gemm.args[1], gemm.args[2])
        norm_args = (*source.args, *NORM_DEFAULTS[len(source.args) - 6:])
        with gm.graph.inserting_before(gemm):
            node = gm.graph.call_function(fused, (*norm_args, list(weights), list(biases)))
        try:
            node.meta["val"] = fake_value(node)
        except Exception as exc:  # never expected: the two ops' own values were made
            gm.graph.erase_node(node)
            log.info("sgdiff: %s not folded into %s's FP8 rows (%s: %s)", source.name, gemm.name,
                     type(exc).__name__, str(exc)[:200])
            continue
        gemm.replace_all_uses_with(node)
        for dead in (gemm, *chain, source):
            gm.graph.erase_node(dead)
        folded += 1
    if folded:
        gm.recompile()
        log.debug("sgdiff: %d LayerNorm-modulates make their FP8 projections' rows", folded)
    return folded


def _views_up(node):
    """``(views, source)``: the views that lead from ``source`` to ``node``, each read only by the
    next (``node`` first), or ``([], None)`` where ``node`` is not a graph value."""
    chain = []
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in VIEWS:
        if len(node.users) != 1:
            return [], None
        chain.append(node)
        node = node.args[0]
    return (chain, node) if isinstance(node, fx.Node) and node.op == "call_function" else ([], None)
