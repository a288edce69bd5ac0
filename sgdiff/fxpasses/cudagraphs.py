"""Run a compiled graph under a CUDA graph (``mode="reduce-overhead"``).

The first ``WARMUP`` calls run normally: the kernels meet their input signatures and are
verified bitwise outside any capture, and the runner learns which inputs keep their address
from call to call (weights, buffers) and which do not (activations). The next call captures
the graph with buffers of its own for the moving inputs; later calls copy those inputs in and
replay. Outputs are returned as fresh tensors (a clone of the graph's static outputs), so a
denoising loop may keep step ``t``'s output while step ``t + 1`` runs.

Anything the capture cannot serve safely runs the graph normally, with one log line: inputs
off the GPU or of another shape, stride or dtype; a weight that moved; a graph that writes
into its inputs; a failed capture.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import torch
from torch import fx

from sgdiff import _compat

log = logging.getLogger("sgdiff")

WARMUP = 2


class CudaGraphRunner:
    def __init__(self, fn: Callable, gm: Optional[fx.GraphModule] = None):
        self.fn = fn
        self.calls = 0
        self.addresses: List[Optional[int]] = []
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.reason: Optional[str] = _mutates_inputs(gm) if gm is not None else None
        if self.reason:
            log.info("sgdiff: CUDA graphs off for a graph: %s", self.reason)

    def __call__(self, *args: Any):
        if self.reason is None:
            self.reason = _unsupported(args)
            if self.reason:
                log.info("sgdiff: CUDA graphs off for a graph: %s", self.reason)
        if self.reason is not None:
            return self.fn(*args)
        if self.graph is None:
            return self._warm_up_or_capture(args)
        return self._replay(args)

    def _warm_up_or_capture(self, args):
        addresses = [a.data_ptr() for a in args]
        self.addresses = addresses if self.calls == 0 else [
            p if p == q else None for p, q in zip(self.addresses, addresses)]  # None: moves
        self.calls += 1
        if self.calls <= WARMUP:
            return self.fn(*args)
        moving = [i for i, p in enumerate(self.addresses) if p is None]
        self.meta = {i: _meta(args[i]) for i in moving}
        self.buffers = {i: torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype,
                                               device=args[i].device) for i in moving}
        self.fixed = [i for i, p in enumerate(self.addresses) if p is not None]
        self.fixed_addresses = [self.addresses[i] for i in self.fixed]
        static = [self.buffers.get(i, a) for i, a in enumerate(args)]
        for i, buf in self.buffers.items():
            buf.copy_(args[i])
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn(*static)  # warm-up on a side stream, as capture requires
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs = self.fn(*static)
        except Exception as exc:  # never break the model: run without graphs from now on
            self.reason = f"capture failed ({type(exc).__name__}: {exc})"
            log.warning("sgdiff: CUDA graphs off for a graph: %s", self.reason)
            return self.fn(*args)
        self.graph = graph
        return self._replay(args)

    def _replay(self, args):
        # Dynamo's guards hold every input's shape, stride, dtype and device, so the weights
        # (hundreds of inputs) need only their address checked; the moving inputs, copied into
        # the graph's buffers, are checked in full. A step's host time before the GPU starts
        # is this check.
        if [args[i].data_ptr() for i in self.fixed] != self.fixed_addresses:
            log.info("sgdiff: a weight or buffer moved since the capture; running without the CUDA graph")
            return self.fn(*args)
        for i, buf in self.buffers.items():
            if _meta(args[i]) != self.meta[i]:
                log.info("sgdiff: input %d differs from the captured one; running without the CUDA graph", i)
                return self.fn(*args)
            buf.copy_(args[i])
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]


def _meta(t: torch.Tensor):
    return t.shape, t.stride(), t.dtype, t.device


def _unsupported(args) -> Optional[str]:
    if not args:
        return "no inputs"
    for a in args:
        if not isinstance(a, torch.Tensor):
            return "a non-tensor input (dynamic shapes)"
        if not a.is_cuda:
            return "an input not on a CUDA device"
    return None


def _mutates_inputs(gm: fx.GraphModule) -> Optional[str]:
    for node in gm.graph.nodes:
        schema = _compat.op_schema(node.target) if node.op == "call_function" else None
        if schema is not None:
            if schema.is_mutable and any(a.op == "placeholder" for a in node.all_input_nodes):
                return f"the graph writes into an input ({node.target})"
    return None
