"""Timing candidates that compute the same bits, to keep the fastest (tuned ops, first sight).

Each candidate runs on the same inputs, round-robin, a few launches per round, GPU time from
CUDA events (wall time on the CPU); a candidate's figure is its best round, which filters out
the rounds another process or a clock change disturbed. It runs outside CUDA-graph capture
only (the dispatcher's business).
"""
from __future__ import annotations

import time
from typing import Callable, List, Sequence, Tuple

import torch

ROUNDS = 3
LAUNCHES = 5  # per round (after one warm-up launch per candidate)


def _round(fn: Callable, args: tuple, cuda: bool) -> float:
    """Seconds a launch of ``fn(*args)`` takes, over LAUNCHES launches."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(LAUNCHES):
            fn(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / LAUNCHES
    t0 = time.perf_counter()
    for _ in range(LAUNCHES):
        fn(*args)
    return (time.perf_counter() - t0) / LAUNCHES


def best_times(candidates: Sequence[Callable], args: tuple) -> List[float]:
    """Each candidate's best per-launch time (seconds) on ``args``, measured alternately."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    for fn in candidates:
        fn(*args)
    if cuda:
        torch.cuda.synchronize()
    best = [float("inf")] * len(candidates)
    for _ in range(ROUNDS):
        for i, fn in enumerate(candidates):
            best[i] = min(best[i], _round(fn, args, cuda))
    return best


def fastest(candidates: Sequence[Callable], args: tuple) -> Tuple[int, List[float]]:
    """The index of the fastest candidate, and every candidate's time."""
    times = best_times(candidates, args)
    return min(range(len(times)), key=times.__getitem__), times
