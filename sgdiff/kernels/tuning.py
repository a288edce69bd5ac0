"""Timing candidates that compute the same bits, to keep the fastest (tuned ops, first sight).

GPU time, not the host's: in a model's first call the host is slow (measured on the H200 in a
Flux step's first call, events around plain launches read cuBLAS's 116 µs GEMM as 433 µs and a
512-row GEMM of about 20 µs as 245 µs, the Triton candidates' leaner launches less inflated,
so they were chosen where cuBLAS is faster). So each round of LAUNCHES launches is enqueued
behind a kernel that holds the stream for HOLD_CYCLES GPU cycles (about 4 ms, longer than the
host takes to issue them): the launches then run back to back and the events around them time
the GPU alone. First sight also follows a compile, with the GPU idle and its clocks down: the
candidates first run round-robin for WARMUP_S of wall time. Then ROUNDS rounds, each starting
at another candidate; a candidate's figure is its best round, which filters out the rounds
another process or a clock change disturbed (wall time on the CPU). The first candidate (the
op's reference: cuBLAS and the eager chain) is kept unless another is faster by more than
MARGIN: same bits, so a choice within the noise is not worth a change. Runs outside CUDA-graph
capture only (the dispatcher's business).

Where a candidate can be captured, its launch is timed as a CUDA graph's replay rather than as
plain launches (:func:`graph_of`): a candidate that does much on the host per call (a few dozen
launches around a library's kernel) would otherwise be charged the host's pace, where the model
replays its CUDA graphs (the default) and the host's part vanishes.
A candidate that cannot be captured is timed from plain launches, as before.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from sgdiff import _compat

log = logging.getLogger("sgdiff")

WARMUP_S = 0.05
CLOCK_HZ = 1.98e9  # the H200's boost clock: cycles a second, to size a hold
HOLD_CYCLES = 8_000_000  # about 4 ms at that clock
ROUNDS = 3
LAUNCHES = 5  # per round
MARGIN = 0.02


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def gpu_seconds(call: Callable[[], Any], hold_cycles: int = HOLD_CYCLES) -> float:
    """GPU seconds of what ``call()`` enqueues on the current stream, its launches queued up
    behind a kernel that holds the stream for ``hold_cycles`` (so the host's pace does not show
    where the hold outlasts the host's issuing)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _compat.hold_stream(hold_cycles)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def graph_of(fn: Callable, args: tuple) -> Optional["torch.cuda.CUDAGraph"]:
    """A CUDA graph of one launch of ``fn(*args)`` (its replays run the GPU's work alone), or
    None where ``fn`` cannot be captured (a host synchronization, an allocation the capture
    refuses): then it is timed from plain launches."""
    try:
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' CUDA calls go on during the capture
        with _compat.cuda_graph_capture(graph, capture_error_mode="thread_local"):
            fn(*args)
        return graph
    except Exception as exc:  # not capturable: timed as launched
        log.info("sgdiff: timing %s from plain launches: no CUDA graph of it (%s: %s)",
                 getattr(fn, "__name__", "a candidate"), type(exc).__name__, str(exc)[:200])
        return None


def _round(fn: Callable, args: tuple, cuda: bool, graph=None) -> float:
    """Seconds a launch of ``fn(*args)`` takes, over LAUNCHES launches (replays of ``graph``, its
    capture, where given)."""
    if cuda:
        launch = graph.replay if graph is not None else lambda: fn(*args)

        def launches():
            for _ in range(LAUNCHES):
                launch()

        return gpu_seconds(launches) / LAUNCHES
    t0 = time.perf_counter()
    for _ in range(LAUNCHES):
        fn(*args)
    return (time.perf_counter() - t0) / LAUNCHES


def best_times(candidates: Sequence[Callable], args: tuple) -> List[float]:
    """Each candidate's best per-launch time (seconds) on ``args``, measured alternately after
    a warm-up of at least WARMUP_S; on the GPU, from replays of each one's CUDA graph where it
    can be captured (:func:`graph_of`)."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    t0 = time.perf_counter()
    while True:
        for fn in candidates:
            fn(*args)
        _sync(cuda)
        if time.perf_counter() - t0 >= WARMUP_S:
            break
    graphs = [graph_of(fn, args) for fn in candidates] if cuda else [None] * len(candidates)
    best = [float("inf")] * len(candidates)
    for r in range(ROUNDS):
        for k in range(len(candidates)):
            i = (r + k) % len(candidates)
            best[i] = min(best[i], _round(candidates[i], args, cuda, graphs[i]))
    return best


def fastest(candidates: Sequence[Callable], args: tuple) -> Tuple[int, List[float]]:
    """The index of the fastest candidate (the first unless another beats it by more than
    MARGIN), and every candidate's time."""
    times = best_times(candidates, args)
    quickest = min(range(len(times)), key=times.__getitem__)
    return (0 if times[0] <= times[quickest] * (1 + MARGIN) else quickest), times


class FirstSight:
    """Per signature, the fastest of labelled candidates that need not compute the same bits (an
    op whose contract allows any of them: attention kernels, tile configurations), chosen once:
    at the signature's first sight on the GPU, outside a CUDA-graph capture, each candidate that
    runs on it is timed against the others (:func:`fastest`: the first kept unless another beats
    it by MARGIN). Inside a capture, or off the GPU, the first candidate serves, unsettled."""

    def __init__(self, what: str):
        self.what = what
        self._chosen: Dict[tuple, Tuple[Any, Callable]] = {}

    def choose(self, key: tuple, candidates: Sequence[Tuple[Any, Callable]], args: tuple) -> Tuple[Any, Callable]:
        """``(label, fn)`` for the signature ``key`` (its first element: what ``choices`` shows)."""
        chosen = self._chosen.get(key)
        if chosen is not None:
            return chosen
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if not cuda or torch.cuda.is_current_stream_capturing():
            return candidates[0]
        running = [(label, fn) for label, fn in candidates if self._runs(label, fn, args)]
        if not running:
            raise RuntimeError(f"no candidate of {self.what} runs on this signature")
        best, times = fastest([fn for _, fn in running], args) if len(running) > 1 else (0, [0.0])
        chosen = self._chosen[key] = running[best]
        log.info("sgdiff: %s %s: %s (%s)", self.what, key[0], chosen[0],
                 ", ".join(f"{label} {t * 1e6:.1f} us" for (label, _), t in zip(running, times)))
        return chosen

    def choices(self) -> list:
        """``[(the key's first element, label)]``: what first sight chose so far."""
        return [(key[0], label) for key, (label, _) in self._chosen.items()]

    def _runs(self, label: Any, fn: Callable, args: tuple) -> bool:
        try:
            fn(*args)
            return True
        except Exception as exc:  # not a candidate here (a kernel refusing the shape, shared memory)
            log.info("sgdiff: %s: %s does not run on this signature: %s", self.what, label, exc)
            return False
