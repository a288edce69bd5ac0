"""CudaGraphRunner's bookkeeping on the CPU: what is replayed, what is copied in, what falls back.

CUDA is stood in for by fakes that record replays; the GPU tests (tests/gpu/test_cudagraphs_gpu.py)
check that real replays stay bitwise equal to eager."""
import contextlib
import logging

import pytest
import torch

from sgdiff.fxpasses import cudagraphs
from sgdiff.fxpasses.cudagraphs import WARMUP, CudaGraphRunner


class FakeGraph:
    replays = 0

    def replay(self):
        FakeGraph.replays += 1


class FakeStream:
    def wait_stream(self, other):
        pass


@pytest.fixture(autouse=True)
def fake_cuda(monkeypatch):
    FakeGraph.replays = 0
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    monkeypatch.setattr(cudagraphs, "_unsupported", lambda args: None)


class Counted:
    """A graph's forward: x * w + b, counting its runs."""

    def __init__(self):
        self.runs = 0

    def __call__(self, x, w, b):
        self.runs += 1
        return [x * w + b]


def captured(x, w, b):
    """A runner past its warm-up calls and its capture (x moves between calls; w, b stay)."""
    fn = Counted()
    runner = CudaGraphRunner(fn)
    for _ in range(WARMUP + 1):
        runner(x.clone(), w, b)
    assert FakeGraph.replays == 1 and fn.runs == WARMUP + 2  # warm-ups, a side-stream run, the capture
    return runner, fn


def test_replays_copy_the_moving_input_and_return_fresh_outputs():
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    x = torch.randn(4, 8)
    first = runner(x, w, b)[0]
    assert FakeGraph.replays == 2 and fn.runs == WARMUP + 2
    moving = [i for i in runner.buffers]
    assert moving == [0] and torch.equal(runner.buffers[0], x)
    assert first is not runner.outputs[0] and torch.equal(first, runner.outputs[0])
    second = runner(x, w, b)[0]
    assert second is not first  # a step's output survives the next replay


def test_a_moved_weight_runs_without_the_graph(caplog):
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    x, moved = torch.randn(4, 8), w.clone()
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        out = runner(x, moved, b)[0]
    assert FakeGraph.replays == 1 and fn.runs == WARMUP + 3
    assert torch.equal(out, x * moved + b)
    assert "moved since the capture" in caplog.text


@pytest.mark.parametrize("change", ["dtype", "shape", "stride"])
def test_a_moving_input_unlike_the_captured_one_runs_without_the_graph(change, caplog):
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    x = {"dtype": torch.randn(4, 8, dtype=torch.float64), "shape": torch.randn(1, 8),
         "stride": torch.randn(8, 4).t()}[change]
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        out = runner(x, w, b)[0]
    assert FakeGraph.replays == 1 and fn.runs == WARMUP + 3
    assert torch.equal(out, x * w + b)
    assert "input 0 differs from the captured one" in caplog.text
