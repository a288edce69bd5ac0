"""Lower sgdiff op calls in an executed graph to direct launcher calls.

A custom op call goes through the dispatcher (tens of µs of host time per call); the graph a
backend runs does not need it: each ``torch.ops.sgdiff.<op>`` node is retargeted to the op's
plain Python launcher (:func:`sgdiff.kernels.dispatch.launcher`), which picks the same
implementation the op would. Graphs meant for export keep the ops.
"""
from __future__ import annotations

from torch import fx

from sgdiff.kernels import dispatch, registry


def lower_to_launchers(gm: fx.GraphModule) -> int:
    """Retarget sgdiff op nodes of ``gm`` in place; returns how many were lowered."""
    by_overload = {}
    for op in registry.ops():
        if not registry.kernel_specs(op.name):  # an op that implements itself: keep the call
            continue
        try:
            by_overload[op.load()] = op.name
        except (ImportError, AttributeError):
            continue
    lowered = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in by_overload and not node.kwargs:
            node.target = dispatch.launcher(by_overload[node.target])
            lowered += 1
    if lowered:
        gm.recompile()
    return lowered
