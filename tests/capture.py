"""Chains captured as the backend captures them: functionalized ATen graphs, no decompositions;
and graphs in the form a CUDA capture gives (``aten._fused_rms_norm``), built by hand.

``make_fx`` alone leaves the in-place ``add_`` of ``F.rms_norm``'s CPU composite in the graph;
``aot_function`` functionalizes it as torch.compile does, so the family tests see what the
passes see in a model.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from diffusers.models.normalization import RMSNorm
from functorch.compile import aot_function, make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from sgdiff.fxpasses import PassManager


def capture(fn: Callable, args: Sequence, dynamic: bool = False) -> torch.fx.GraphModule:
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    with torch.no_grad():
        aot_function(fn, fw_compiler=compiler, decompositions={}, dynamic=dynamic)(*args)
    return graphs[0]


def rewrite(fn: Callable, args: Sequence, quality="lossless", families=None, dynamic=False):
    """Capture ``fn``, apply the pass manager; return (a callable like ``fn``, graph, result)."""
    gm = capture(fn, args, dynamic)
    result = PassManager(quality, families=families).apply(gm)

    def run(*a):
        out = gm(*[t for t in a if isinstance(t, torch.Tensor)])
        return out[0] if len(out) == 1 else tuple(out)

    return run, gm, result


def fx_graph(fn, *args):
    """``fn`` traced by torch.fx, ATen calls kept as written (make_fx would decompose
    ``aten._fused_rms_norm`` on CPU, where F.rms_norm is composite), with fake-tensor meta."""
    gm = torch.fx.symbolic_trace(fn)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    return gm


def diffusers_rms_norm(x, weight, eps):
    """diffusers' RMSNorm module itself, its weight passed in."""
    module = RMSNorm(x.shape[-1], eps, elementwise_affine=weight is not None)
    return torch.func.functional_call(module, {} if weight is None else {"weight": weight}, (x,))
