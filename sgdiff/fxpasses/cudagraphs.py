"""Run a compiled graph under CUDA graphs: on by default, one graph per input shape.

A step of a DiT is hundreds of kernel launches; where the GPU is fast and the model small (Sana
at batch 2, two-block models, the VAE's small stages) the host's launch time is the step time.
A CUDA graph replays every launch of the step from one host call, so the default call
``torch.compile(m, backend="sgdiff")`` runs its graphs this way (``options={"cudagraphs": False}``
or ``mode="max-autotune-no-cudagraphs"`` turns it off).

Per shape (one static graph serves one; under ``dynamic=True`` each set of sizes gets its own,
up to :data:`MAX_GRAPHS` per compiled graph), the first ``WARMUP`` calls run normally: the kernels
meet their input signatures and are verified bitwise outside any capture, and the runner learns
which inputs keep their address from call to call (weights, buffers) and which do not
(activations). The next call captures the graph with buffers of its own for the moving inputs;
later calls copy those inputs in and replay. Outputs are returned as fresh tensors (a clone of
the graph's static outputs), so a denoising loop may keep step ``t``'s output while step
``t + 1`` runs.

Memory: each capture holds a memory pool of its own between calls (the graph's working
memory, as the caching allocator would keep it cached anyway), plus a copy of its moving inputs
and of its outputs. (One pool shared by every capture of a device was tried: Wan 2.1 1.3B's
step at 480p x 81 frames peaked at 9.7 GiB with it, where a pool per graph had measured 4.0.)

A graph is kept only where it pays: right after the capture and one untimed replay (a graph's
first launch uploads it to the GPU), the graph run directly and its
replay (copying the moving inputs in and the outputs out) are timed against each other,
alternating in balanced order (direct, replay, replay, direct: a drift of the clocks falls on
both alike), twice over: wall time (what the host's launches cost, where the host is the
bottleneck) and GPU time with the launches queued up behind a held stream (what the copies cost,
where the host runs ahead of the GPU, as it does between a VAE decode's large convolutions). The
replay is kept if it is no slower on the wall clock (within WALL_SLACK: a GPU-bound graph's two
times are equal but for noise) and adds at most GPU_SLACK (and GPU_SLACK_S) of GPU time; else
the graph runs directly from then on, with one log line. Measured on the H200:
Wan 2.1's decode at 480p x 81 frames took 1.03x eager's time with every graph replayed, and
1.02x with the wall-time test alone (its small per-frame graphs replay faster alone, but between
the convolutions the host's launches are hidden anyway and the copies are not). Compiled as one
graph (an H100), its replay and its direct run take the same time (1.49 and 1.50 s), so the
replay is kept, and its pool keeps 3.8 GiB more reserved between calls: a pipeline's VAE is
therefore compiled without CUDA graphs unless asked (:mod:`sgdiff.pipelines`).

Anything the capture cannot serve safely runs the graph normally, with one log line: inputs
off the GPU; a graph that writes into its inputs; a failed capture; shapes beyond the cap.
A weight or buffer given new storage after the capture (``param.data = ...``) is captured
again under its new address (a LoRA swap), up to the cap. An activation can keep its address
over the warm-up calls and move once graphs replay (Dynamo splits a model into frames with
eager code between them, whose allocations follow another pattern once the frames' outputs are
clones of captured ones): where the compile names the weights and buffers (aot_autograd's
static inputs), such an input, seen moving, is copied in from then on and the graph captured
once more, where otherwise every capture would move it again until the cap. Where the graph
runs an op that keeps a derived copy of an input (``caches_inputs``: a weight's FP8 copy), an
in-place change of a fixed input (its version) is captured again the same way, after warm-up
calls that remake the copy: the replay would read the old one.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.kernels import registry, tuning

log = logging.getLogger("sgdiff")

WARMUP = 2
#: rounds of the graph run directly against its replay, alternating, when a capture is timed
PAY_ROUNDS = 2
#: GPU time a replay may add to the graph run directly (its copies) and still be kept: a share
#: of it, and a few small copies' worth more (a graph of microseconds, host-bound, copying a
#: latent and a timestep in)
GPU_SLACK = 0.02
GPU_SLACK_S = 20e-6
#: how much slower on the wall clock a replay may measure and still be kept: a GPU-bound graph
#: (a DiT step of 130 ms whose host issues in 60) replays in the same wall time within the
#: noise, and its replay frees the host to run ahead (Flux.1-dev's step under the default call
#: ran its graph directly, 64 ms of host time a step, where a strict "faster" lost the toss)
WALL_SLACK = 0.02
#: captures per compiled graph (and tier): one per shape served, and one more each time the
#: weights moved; past it, calls run without a CUDA graph
MAX_GRAPHS = 8

_SIDE_STREAMS: Dict[torch.device, Any] = {}


class CudaGraphRunner:
    """``fn`` (a compiled graph's forward) run under CUDA graphs, one per input shape."""

    def __init__(self, fn: Callable, gm: Optional[fx.GraphModule] = None, max_graphs: int = MAX_GRAPHS,
                 static_inputs: Optional[Sequence[int]] = None):
        self.fn = fn
        self.max_graphs = max_graphs
        # the positions of the weights and buffers, where the compile knew them (else None)
        self.static = None if static_inputs is None else frozenset(static_inputs)
        self.captures = 0
        self.shapes: Dict[Tuple, _ShapeGraph] = {}
        self.sized = _symbolic_positions(gm)  # inputs whose shape the key must hold (dynamic shapes)
        self.reason: Optional[str] = _mutates_inputs(gm) if gm is not None else None
        self.watch_versions = gm is not None and any(
            registry.op_def(op).caches_inputs for op in gm.meta.get("sgdiff_ops", ()))
        self._said_full = False
        # set on the first call: the inputs' kinds and devices, which the compile's guards then hold
        # (each input's type, device, dtype and shape), so that a call checks them no more
        self.scalars: Optional[Tuple[int, ...]] = None
        if self.reason:
            log.info("sgdiff: CUDA graphs off for a graph: %s", self.reason)

    def __call__(self, *args: Any):
        if self.scalars is None and self.reason is None:
            self.reason, quiet = _unsupported(args)
            if self.reason and not quiet:
                log.info("sgdiff: CUDA graphs off for a graph: %s", self.reason)
            self.scalars = tuple(i for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
            if self.sized is None:
                self.sized = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if self.reason is not None:
            return self.fn(*args)
        key = self._key(args)
        shape = self.shapes.get(key)
        if shape is None:
            if len(self.shapes) >= self.max_graphs or self.captures >= self.max_graphs:
                return self._full(args)
            shape = self.shapes[key] = _ShapeGraph(self)
        return shape(args)

    def _key(self, args) -> Tuple:
        """The numbers among the inputs and the shapes of those whose shape may change (every
        tensor's, where the graph does not say which are symbolic)."""
        return tuple(args[i] for i in self.scalars) + tuple(args[i].shape for i in self.sized)

    def _full(self, args):
        if not self._said_full:
            self._said_full = True
            log.info("sgdiff: %d CUDA graphs captured for a graph, the most it keeps; calls that "
                     "would need another run without one", self.max_graphs)
        return self.fn(*args)

    def capture(self, static: List[Any]):
        """A CUDA graph of ``fn(*static)`` and its static outputs (the caller handles failures)."""
        device = next(a.device for a in static if isinstance(a, torch.Tensor))
        with torch.cuda.device(device):  # the inputs' device, whichever is current
            # one side stream per device for every warm-up (cuBLAS keeps a workspace per stream)
            if device not in _SIDE_STREAMS:
                _SIDE_STREAMS[device] = torch.cuda.Stream(device)
            side = _SIDE_STREAMS[device]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn(*static)  # warm-up on a side stream, as capture requires
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with _compat.cuda_graph_capture(graph):
                outputs = self.fn(*static)
        self.captures += 1
        return graph, outputs


class _ShapeGraph:
    """The CUDA graph of one input shape: warm-up calls, then a capture, then replays."""

    def __init__(self, runner: CudaGraphRunner):
        self.runner = runner
        self.calls = 0
        self.addresses: List[Optional[int]] = []
        self.graph = None
        self.off = False
        self.seen_moving: Set[int] = set()  # activations that moved after a capture: copied in from then on

    def __call__(self, args):
        if self.off:
            return self.runner.fn(*args)
        if self.graph is None:
            return self._warm_up_or_capture(args)
        return self._replay(args)

    def _warm_up_or_capture(self, args):
        runner = self.runner
        addresses = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        self.addresses = addresses if self.calls == 0 else [
            p if p == q else None for p, q in zip(self.addresses, addresses)]  # None: moves
        self.calls += 1
        if self.calls <= WARMUP:
            return runner.fn(*args)
        if runner.captures >= runner.max_graphs:
            self.off = True
            return runner._full(args)
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        moving = [i for i in tensors if self.addresses[i] is None or i in self.seen_moving]
        self.meta = {i: _meta(args[i]) for i in moving}
        self.buffers = {i: torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype,
                                               device=args[i].device) for i in moving}
        self.fixed = [i for i in tensors if i not in self.buffers]
        self.fixed_addresses = [self.addresses[i] for i in self.fixed]
        fixed = set(self.fixed)
        self.addresses_by_position = [self.addresses[i] if i in fixed else None for i in range(len(args))]
        self.fixed_versions = self._versions(args)
        static = [self.buffers.get(i, a) for i, a in enumerate(args)]
        for i, buf in self.buffers.items():
            buf.copy_(args[i])
        try:
            self.graph, self.outputs = runner.capture(static)
        except Exception as exc:  # never break the model: run without graphs from now on
            runner.reason = f"capture failed ({type(exc).__name__}: {exc})"
            log.warning("sgdiff: CUDA graphs off for a graph: %s", runner.reason)
            return runner.fn(*args)
        if not self._replay_pays(args):
            self.graph = self.outputs = self.buffers = None
            self.off = True
            return runner.fn(*args)
        return self._replay(args)

    def _replay_pays(self, args) -> bool:
        """Whether a replay beats the graph run directly on these inputs: faster on the wall clock
        and within the GPU-time slack (the module doc; :func:`balanced_means`)."""
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        # a graph's first launch uploads it to the GPU (CUDA does so where no cudaGraphUpload came
        # first): once, untimed, so that neither timing counts it
        self.graph.replay()
        calls = (lambda: self.runner.fn(*args), lambda: self._replay(args))
        direct, replay = balanced_means(calls, lambda call: _seconds(call, device))
        hold = int(2 * direct * tuning.CLOCK_HZ)  # outlasts the host's issuing of a direct run
        direct_gpu, replay_gpu = balanced_means(calls, lambda call: _gpu_seconds(call, device, hold))
        figures = (replay * 1e3, direct * 1e3, replay_gpu * 1e3, direct_gpu * 1e3)
        if replay <= direct * (1 + WALL_SLACK) and replay_gpu <= direct_gpu * (1 + GPU_SLACK) + GPU_SLACK_S:
            log.debug("sgdiff: CUDA graph kept: replay %.3f ms, run directly %.3f ms (GPU time %.3f, %.3f); "
                      "%.1f MiB of inputs and outputs held", *figures, self.held_bytes() / 2**20)
            return True
        log.info("sgdiff: CUDA graph dropped for a graph: its replay (%.3f ms, copies included) against the "
                 "graph run directly (%.3f ms), GPU time %.3f against %.3f ms", *figures)
        return False

    def held_bytes(self) -> int:
        """Bytes the capture holds between calls: its copies of the moving inputs, its outputs."""
        held = [*(self.buffers or {}).values(), *(self.outputs or ())]
        return sum(t.untyped_storage().nbytes() for t in held if isinstance(t, torch.Tensor))

    def _replay(self, args):
        # Dynamo's guards hold every input's shape, stride, dtype and device, so the weights
        # (hundreds of inputs) need only their address checked; the moving inputs, copied into
        # the graph's buffers, are checked in full. A step's host time before the GPU starts
        # is this check.
        args = list(args)
        if not _compat.addresses_equal(args, self.addresses_by_position, self.fixed):
            moved = [i for i, then in zip(self.fixed, self.fixed_addresses) if args[i].data_ptr() != then]
            static = self.runner.static
            activations = [i for i in moved if static is not None and i not in static]
            if activations:
                self.seen_moving.update(activations)
                log.info("sgdiff: %d inputs that are no weight or buffer kept their address over the warm-up calls "
                         "and moved since the capture; copying them into the graph from now on, capturing it again",
                         len(activations))
            else:
                log.info("sgdiff: a weight or buffer moved since the capture; capturing the graph again")
            return self._recapture(args)
        if self.runner.watch_versions and self._versions(args) != self.fixed_versions:
            log.info("sgdiff: a weight or buffer changed in place since the capture, and the graph keeps a copy "
                     "derived from it; capturing the graph again")
            return self._recapture(args)
        for i in self.buffers:
            if _meta(args[i]) != self.meta[i]:
                log.info("sgdiff: input %d differs from the captured one; running without the CUDA graph", i)
                return self.runner.fn(*args)
        _compat.copy_all(list(self.buffers.values()), [args[i] for i in self.buffers])
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]

    def _recapture(self, args):
        self.graph = self.outputs = self.buffers = None
        self.calls = 0
        return self._warm_up_or_capture(args)

    def _versions(self, args) -> Optional[List[int]]:
        """The fixed inputs' version counters, where the runner watches them (else None)."""
        if not self.runner.watch_versions:
            return None
        return [_compat.version(args[i]) for i in self.fixed]


def balanced_means(calls: Sequence[Callable[[], Any]], measure: Callable[[Callable[[], Any]], float]) -> List[float]:
    """Each call's mean ``measure(call)`` over :data:`PAY_ROUNDS` rounds, every other round in
    reverse order (direct, replay, replay, direct, ...): a drift across the rounds (a power-capped
    GPU's clock falling as it warms: 1980 to about 1680 MHz over a Wan 2.1 step on the H100,
    ``bench/results/runs/h100-2026-12-05.md``) weighs on both alike, where in a fixed order it
    falls on the one timed second, the replay."""
    times: List[List[float]] = [[] for _ in calls]
    for r in range(PAY_ROUNDS):
        for i in (range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))):
            times[i].append(measure(calls[i]))
    return [sum(t) / len(t) for t in times]


def _seconds(call: Callable[[], Any], device: torch.device) -> float:
    """Wall time of ``call()`` up to its last kernel on ``device``."""
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    call()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _gpu_seconds(call: Callable[[], Any], device: torch.device, hold_cycles: int) -> float:
    """GPU time of ``call()`` on ``device``, its launches queued up behind a held stream."""
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        return tuning.gpu_seconds(call, hold_cycles)


def _meta(t: torch.Tensor):
    return t.shape, t.stride(), t.dtype, t.device


def _unsupported(args) -> Tuple[Optional[str], bool]:
    """Why these inputs cannot be served by a capture, if so, and whether that goes unsaid (a
    graph with nothing on a CUDA device: CUDA graphs have nothing to offer it)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not any(a.is_cuda for a in tensors):
        return "no input on a CUDA device", True
    if not all(a.is_cuda for a in tensors):
        return "an input not on a CUDA device", False
    if not all(isinstance(a, (torch.Tensor, int, float, bool)) or a is None for a in args):
        return "an input that is neither a tensor nor a number", False
    return None, False


def _symbolic_positions(gm: Optional[fx.GraphModule]) -> Optional[Tuple[int, ...]]:
    """Positions of the graph's tensor inputs whose shape or stride is symbolic (None: unknown)."""
    if gm is None:
        return None
    positions = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
                positions.append(i)
        elif val is None and "val" not in node.meta:
            return None
    return tuple(positions)


def _mutates_inputs(gm: fx.GraphModule) -> Optional[str]:
    for node in gm.graph.nodes:
        schema = _compat.op_schema(node.target) if node.op == "call_function" else None
        if schema is not None:
            if schema.is_mutable and any(a.op == "placeholder" for a in node.all_input_nodes):
                return f"the graph writes into an input ({node.target})"
    return None
