"""Lower sgdiff op calls in an executed graph to direct calls.

A custom op call goes through the dispatcher (tens of µs of host time per call); the graph a
backend runs does not need it. Each ``torch.ops.sgdiff.<op>`` node is retargeted to a plain
Python runner that picks the same implementation the op would: with static shapes one of
the site's own (:class:`sgdiff.kernels.dispatch.CallSite`, which settles per pointer
alignment and then skips the signature and the host arithmetic), else the op's
(:func:`sgdiff.kernels.dispatch.runner`); or, where the op has nothing but its reference on
that device and dtype, the reference itself: the eager chain, at the eager chain's cost.
Graphs meant for export keep the ops. The names of the ops lowered are left in
``gm.meta["sgdiff_ops"]`` (what a CUDA graph of it must watch: :mod:`sgdiff.fxpasses.cudagraphs`).
"""
from __future__ import annotations

import torch
from torch import fx

from sgdiff.kernels import dispatch, registry


def lower_to_call_sites(gm: fx.GraphModule) -> int:
    """Retarget sgdiff op nodes of ``gm`` in place; returns how many were lowered."""
    by_overload = {}
    for op in registry.ops():
        if not registry.kernel_specs(op.name):  # an op that implements itself: keep the call
            continue
        try:
            by_overload[op.load()] = op.name
        except (ImportError, AttributeError):
            continue
    lowered, names = 0, set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in by_overload and not node.kwargs:
            op = by_overload[node.target]
            x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if isinstance(x, torch.Tensor) and not dispatch.accelerated(op, x.device.type, x.dtype):
                node.target = dispatch.reference(op)
            else:
                tensors = _static_tensor_positions(node)
                node.target = dispatch.runner(op) if tensors is None else dispatch.CallSite(op, tensors)
                names.add(op)
            lowered += 1
    gm.meta["sgdiff_ops"] = tuple(sorted(names))
    if lowered:
        gm.recompile()
    return lowered


def _static_tensor_positions(node: fx.Node):
    """Positions of the node's tensor arguments (``(argument, None)``, or ``(argument, item)`` in a
    list of tensors), or None where a signature can vary between
    calls beyond alignment (a symbolic size or stride, an argument without metadata)."""
    positions = []
    for i, arg in enumerate(node.args):
        items = [(j, a) for j, a in enumerate(arg)] if isinstance(arg, (list, tuple)) else [(None, arg)]
        for j, a in items:
            if not isinstance(a, fx.Node):
                continue
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride())):
                return None
            positions.append((i, j))
    return tuple(positions)
