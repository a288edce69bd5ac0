"""The torch.compile backend: options -> aot_autograd capture -> passes -> run.

``torch.compile(model, backend="sgdiff")`` finds :func:`sgdiff_backend` through the
``torch_dynamo_backends`` entry point; importing sgdiff never registers it a second time.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.fxpasses import ManagerResult, PassManager
from sgdiff.fxpasses.constants import fold_constants
from sgdiff.fxpasses.copies import lazy_contiguous
from sgdiff.fxpasses.cudagraphs import CudaGraphRunner
from sgdiff.fxpasses.direct_aten import direct_aten_calls
from sgdiff.fxpasses.lowering import lower_to_call_sites
from sgdiff.kernels import dispatch
from sgdiff.options import Options
from sgdiff.tiers import Tier, current_call_tier

log = logging.getLogger("sgdiff")

_compat.fold_tensor_str_comparisons()  # before the first trace: a graph break there is a graph lost

ResultSink = Callable[[ManagerResult], None]


def sgdiff_backend(gm: fx.GraphModule, example_inputs: List[Any], *,
                   options: Optional[Mapping[str, Any]] = None, mode: Optional[str] = None) -> Callable:
    """Dynamo backend entry point (``backend="sgdiff"``)."""
    return SgdiffBackend(Options.parse(options, mode))(gm, example_inputs)


class SgdiffBackend:
    """A backend bound to one set of options; ``on_result`` sees every graph's pass results."""

    def __init__(self, options: Options = Options(), on_result: Optional[ResultSink] = None):
        self.options = options
        self.on_result = on_result

    def __call__(self, gm: fx.GraphModule, example_inputs: List[Any]) -> Callable:
        return _compat.aot_capture(self.compile_graph)(gm, example_inputs)

    def compile_graph(self, gm: fx.GraphModule, example_inputs: List[Any]) -> Callable:
        return _compat.boxed(TieredGraph(gm, self.options, self.on_result, _compat.static_input_positions()))


class TieredGraph:
    """One captured ATen graph, rewritten once per quality tier on first use.

    The tier of a call is the one set by ``with sgdiff.quality(...)`` or else the compiled
    default; variants are kept apart, so no tier runs another tier's rewrite.
    """

    def __init__(self, gm: fx.GraphModule, options: Options, on_result: Optional[ResultSink],
                 static_inputs: Optional[Sequence[int]] = None):
        self.options = options
        self.on_result = on_result
        self.static_inputs = static_inputs  # the weights' and buffers' positions, where known
        self._pristine = _copy(gm)
        self._variants: Dict[Tier, Callable] = {}
        self._build(options.quality, gm)

    def __call__(self, *args: Any):
        tier = current_call_tier() or self.options.quality
        fn = self._variants.get(tier) or self._build(tier, _copy(self._pristine))
        dispatch.new_graph_call()
        with dispatch.verification(self.options.verify):
            return fn(*args)

    def _build(self, tier: Tier, gm: fx.GraphModule) -> Callable:
        try:
            fold_constants(gm)
            result = PassManager(tier, families=self.options.chosen_families(graph_device(gm))).apply(gm)
        except Exception:  # never break a user's model: run the captured graph as it is
            log.exception("sgdiff: passes failed on a graph; running it unchanged")
            gm = _copy(self._pristine)
            result = None
        if result is not None and self.on_result is not None:
            self.on_result(result)
        lower_to_call_sites(gm)
        lazy_contiguous(gm)
        direct_aten_calls(gm)
        fn = gm.forward
        if self.options.cudagraphs:
            fn = CudaGraphRunner(fn, gm, static_inputs=self.static_inputs)
        self._variants[tier] = fn
        return fn


def graph_device(gm: fx.GraphModule) -> Optional[torch.device]:
    """The device of the graph's first tensor input on a GPU, else of its first tensor input
    (None: no tensor input)."""
    devices = [node.meta["val"].device for node in gm.graph.nodes
               if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)]
    return next((d for d in devices if d.type == "cuda"), devices[0] if devices else None)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule over a fresh copy of ``gm``'s graph (node meta copied shallowly)."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return fx.GraphModule(gm, graph)
