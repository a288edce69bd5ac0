"""Timing candidates that compute the same bits, to keep the fastest (tuned ops, first sight).

First sight usually comes after a compile, with the GPU idle and its clocks down: the
candidates first run round-robin for WARMUP_S of wall time, so the clocks are up before any is
timed (measured on the H200 in a Flux step's first call, without it: cuBLAS's 116 µs GEMM read
433 µs, the Triton candidates timed after it 144-183). Then ROUNDS rounds, each starting at
another candidate, of LAUNCHES launches per candidate, GPU time from CUDA events (wall time on
the CPU); a candidate's figure is its best round, which filters out the rounds another process
or a clock change disturbed. The first candidate (the op's reference: cuBLAS and the eager
chain) is kept unless another is faster by more than MARGIN: same bits, so a choice within the
noise is not worth a change. Runs outside CUDA-graph capture only (the dispatcher's business).
"""
from __future__ import annotations

import time
from typing import Callable, List, Sequence, Tuple

import torch

WARMUP_S = 0.05
ROUNDS = 5
LAUNCHES = 5  # per round
MARGIN = 0.02


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


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
    """Each candidate's best per-launch time (seconds) on ``args``, measured alternately after
    a warm-up of at least WARMUP_S."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    t0 = time.perf_counter()
    while True:
        for fn in candidates:
            fn(*args)
        _sync(cuda)
        if time.perf_counter() - t0 >= WARMUP_S:
            break
    best = [float("inf")] * len(candidates)
    for r in range(ROUNDS):
        for k in range(len(candidates)):
            i = (r + k) % len(candidates)
            best[i] = min(best[i], _round(candidates[i], args, cuda))
    return best


def fastest(candidates: Sequence[Callable], args: tuple) -> Tuple[int, List[float]]:
    """The index of the fastest candidate (the first unless another beats it by more than
    MARGIN), and every candidate's time."""
    times = best_times(candidates, args)
    quickest = min(range(len(times)), key=times.__getitem__)
    return (0 if times[0] <= times[quickest] * (1 + MARGIN) else quickest), times
