"""GPU and wall-clock timing helpers shared by the benchmarks."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict

import torch


def _graph(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    """``calls`` calls of ``fn`` captured in a CUDA graph (after warm-up calls on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def gpu_times(fns: Dict[str, Callable[[], object]], calls_per_graph: int = 20,
              replays: int = 20) -> Dict[str, float]:
    """Median GPU time of one call of each of ``fns`` in µs, from CUDA-graph replays (launch gaps
    removed) that alternate between them, so that a drift of the GPU's clocks reaches each alike.
    Each timed replay follows an untimed one of the same graph: it finds the cache as the last of
    its own calls left it, as in back-to-back replays, not as another function's left it."""
    graphs = {name: _graph(fn, calls_per_graph) for name, fn in fns.items()}
    times: Dict[str, list] = {name: [] for name in fns}
    for _ in range(replays):
        for name, graph in graphs.items():
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / calls_per_graph)
    return {name: statistics.median(t) for name, t in times.items()}


def alternating(fns: Dict[str, Callable[[], object]], calls: int, rounds: int,
                sync: Callable[[], None]) -> Dict[str, float]:
    """Median seconds a call of each of ``fns``: ``rounds`` rounds of ``calls`` calls each, then
    ``sync()``, the rounds of the functions alternating, so that a drift of the host's speed (a
    process's first calls, other load) reaches every one of them alike and their ratios hold."""
    sync()
    times: Dict[str, list] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def wall_us(fns: Dict[str, Callable[[], object]], calls: int = 200, rounds: int = 7) -> Dict[str, float]:
    """Median wall time of one call of each of ``fns`` in µs (host dispatch included), after 10
    warm-up calls, from :func:`alternating` rounds synchronized every ``calls`` calls."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    return {name: t * 1e6 for name, t in alternating(fns, calls, rounds, torch.cuda.synchronize).items()}


def call_ms(fn: Callable[[], object], device: torch.device) -> float:
    """ms of one call of ``fn`` from an idle device to its last kernel: CUDA events around it
    (wall clock on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
