"""CudaGraphRunner's bookkeeping on the CPU: what is replayed, what is copied in, what falls back.

CUDA is stood in for by fakes that record replays; the GPU tests (tests/gpu/test_cudagraphs_gpu.py)
check that real replays stay bitwise equal to eager."""
import contextlib
import logging

import pytest
import torch

from sgdiff.fxpasses import cudagraphs
from sgdiff.fxpasses.cudagraphs import WARMUP, CudaGraphRunner

REPLAY_PAYS = cudagraphs._ShapeGraph._replay_pays


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
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream())
    monkeypatch.setattr(cudagraphs, "_SIDE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "current_stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(cudagraphs, "_unsupported", lambda args: (None, False))
    # a capture is kept (test_a_replay_that_does_not_pay_is_dropped times it)
    monkeypatch.setattr(cudagraphs._ShapeGraph, "_replay_pays", lambda self, args: True)


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
    shape = runner.shapes[(torch.Size([4, 8]), torch.Size([4, 8]), torch.Size([8]))]
    moving = [i for i in shape.buffers]
    assert moving == [0] and torch.equal(shape.buffers[0], x)
    assert first is not shape.outputs[0] and torch.equal(first, shape.outputs[0])
    second = runner(x, w, b)[0]
    assert second is not first  # a step's output survives the next replay


def test_a_moved_weight_is_captured_again_under_its_new_address(caplog):
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    xs, moved = [torch.randn(4, 8) for _ in range(WARMUP + 1)], w.clone()
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        outs = [runner(x, moved, b)[0] for x in xs]
    assert FakeGraph.replays == 2 and runner.captures == 2  # warm-ups of the new address, a capture
    assert all(torch.equal(out, x * moved + b) for out, x in zip(outs, xs))
    assert next(iter(runner.shapes.values())).fixed_addresses == [moved.data_ptr(), b.data_ptr()]
    assert "moved since the capture; capturing the graph again" in caplog.text
    runner(torch.randn(4, 8), moved, b)
    assert FakeGraph.replays == 3 and runner.captures == 2


@pytest.mark.parametrize("static", [None, (1, 2)])
def test_an_activation_that_kept_its_address_over_the_warm_up_is_copied_in_once_it_moves(caplog, static):
    """Dynamo's frames with eager code between them: an activation sits at one address as long as
    the allocations around it follow one pattern, and each capture changes that pattern (here:
    the input moves to a new address it then keeps, after every capture). Where the compile named
    the weights and buffers (positions 1 and 2), the activation is captured once more as a moving
    input and replays from then on; without that knowledge it is taken for a weight that moved,
    and every move costs a capture, until the cap."""
    w, b = torch.randn(4, 8), torch.randn(8)
    fn = Counted()
    runner = CudaGraphRunner(fn, max_graphs=4, static_inputs=static)
    held, captures = torch.randn(4, 8), 0
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        for _ in range(6 * (WARMUP + 2)):
            if runner.captures != captures:  # the allocations' pattern after a capture
                held, captures = torch.randn(4, 8), runner.captures
            runner(held, w, b)
    shape = next(iter(runner.shapes.values()))
    if static is None:
        assert runner.captures == 4 and caplog.text.count("a weight or buffer moved since the capture") == 4
    else:
        assert runner.captures == 2 and list(shape.buffers) == [0] and shape.fixed == [1, 2]
        assert caplog.text.count("copying them into the graph from now on") == 1
        assert "a weight or buffer moved" not in caplog.text


def test_the_compile_names_the_weights_and_buffers_as_static_inputs():
    """aot_autograd's static inputs reach the CUDA graph runner: a Linear's weight and bias and a
    buffer, not the activations."""
    from sgdiff import _compat
    from sgdiff.backend import SgdiffBackend

    seen = []

    class Spy(SgdiffBackend):
        def compile_graph(self, gm, example_inputs):
            seen.append((_compat.static_input_positions(), [tuple(e.shape) for e in example_inputs]))
            return super().compile_graph(gm, example_inputs)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 16)
            self.register_buffer("shift", torch.ones(16))

        def forward(self, x, y):
            return self.lin(x) + self.shift + y

    with torch.no_grad():
        torch.compile(M(), backend=Spy())(torch.randn(4, 8), torch.randn(4, 16))
    (static, shapes), = seen
    assert sorted(shapes[i] for i in static) == [(16,), (16,), (16, 8)]
    assert sorted(shapes[i] for i in range(len(shapes)) if i not in static) == [(4, 8), (4, 16)]


def test_weights_that_keep_moving_stop_at_the_cap(caplog):
    w, b = torch.randn(4, 8), torch.randn(8)
    fn = Counted()
    runner = CudaGraphRunner(fn, max_graphs=2)
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        for _ in range(5):
            moved = w.clone()  # a new address, kept for a few calls (a weight moving every call is
            for _ in range(WARMUP + 2):  # an input like the activations: copied in, never recaptured)
                runner(torch.randn(4, 8), moved, b)  # (the fake replays compute nothing)
    calls, replays = 5 * (WARMUP + 2), 2  # the call after each capture replays it; a capture runs twice
    assert runner.captures == 2 and FakeGraph.replays == 2 * 2 and fn.runs == calls - replays + 2
    assert caplog.text.count("the most it keeps") == 1


def test_each_shape_gets_its_graph_up_to_the_cap(caplog):
    """Under dynamic shapes the sizes come as numbers beside the tensors: each set of them is a
    key with a capture of its own; past the cap, new shapes run without one, said once."""
    fn = lambda x, n: [x * n]  # noqa: E731
    runner = CudaGraphRunner(fn, max_graphs=3)
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        for n in (1, 2, 3, 4, 5) * (WARMUP + 2):
            runner(torch.randn(n, 4), n)  # (the fake replays compute nothing)
    assert sorted(runner.shapes) == [(1, torch.Size([1, 4])), (2, torch.Size([2, 4])), (3, torch.Size([3, 4]))]
    assert runner.captures == 3 and FakeGraph.replays == 3 * 2  # per kept shape: capture, then one replay
    assert caplog.text.count("3 CUDA graphs captured for a graph, the most it keeps") == 1


def test_the_key_holds_the_shapes_of_symbolic_inputs_only():
    """A graph whose first input has a symbolic size: that input's shape is part of the key, the
    weights' (static) shapes are not looked at."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())

    def fake(t, *dims):
        return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=list(dims)))

    x = fake(torch.randn(3, 4), DimDynamic.DYNAMIC, DimDynamic.STATIC)
    w = fake(torch.randn(4, 4), DimDynamic.STATIC, DimDynamic.STATIC)
    graph = torch.fx.Graph()
    for name, val in (("x", x), ("w", w)):
        graph.placeholder(name).meta["val"] = val
    graph.output(None)
    gm = torch.fx.GraphModule({}, graph)
    assert cudagraphs._symbolic_positions(gm) == (0,)
    runner = CudaGraphRunner(lambda x, w: [x @ w], gm)
    runner(torch.randn(5, 4), torch.randn(4, 4))
    assert list(runner.shapes) == [(torch.Size([5, 4]),)]


def test_the_inputs_kinds_are_checked_on_the_first_call_only(monkeypatch):
    """The compile's guards hold each input's type and device from then on: a replay's host time
    goes to no check of them (Sana's step has 400 inputs)."""
    checked = []
    monkeypatch.setattr(cudagraphs, "_unsupported", lambda args: checked.append(len(args)) or (None, False))
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    for _ in range(3):
        runner(torch.randn(4, 8), w, b)
    assert checked == [3] and FakeGraph.replays == 4 and runner.scalars == ()


def test_numbers_among_the_inputs_key_their_own_graph():
    fn = Counted()
    runner = CudaGraphRunner(lambda x, w, n: fn(x, w, n))
    w = torch.randn(4, 8)
    for n in (1.0, 2.0, 1.0):
        runner(torch.randn(4, 8), w, n)
    assert runner.scalars == (2,) and sorted(k[0] for k in runner.shapes) == [1.0, 2.0]


@pytest.mark.parametrize("moved", [False, True])
def test_the_address_check_agrees_with_each_address(moved):
    from sgdiff import _compat

    tensors = [torch.randn(3), 2, torch.randn(4), torch.randn(5)]
    addresses = [t.data_ptr() if isinstance(t, torch.Tensor) else None for t in tensors]
    if moved:
        addresses[3] += 2
    assert _compat.addresses_equal(tensors, addresses, [0, 3]) is (not moved)
    assert _compat.addresses_equal(tensors, addresses, [0, 2])


def test_a_moving_input_of_another_shape_starts_a_graph_of_its_own():
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    x = torch.randn(1, 8)
    assert torch.equal(runner(x, w, b)[0], x * w + b)
    assert len(runner.shapes) == 2 and FakeGraph.replays == 1 and fn.runs == WARMUP + 3


@pytest.mark.parametrize("change", ["dtype", "stride"])
def test_a_moving_input_unlike_the_captured_one_runs_without_the_graph(change, caplog):
    w, b = torch.randn(4, 8), torch.randn(8)
    runner, fn = captured(torch.randn(4, 8), w, b)
    x = {"dtype": torch.randn(4, 8, dtype=torch.float64), "stride": torch.randn(8, 4).t()}[change]
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        out = runner(x, w, b)[0]
    assert FakeGraph.replays == 1 and fn.runs == WARMUP + 3
    assert torch.equal(out, x * w + b)
    assert "input 0 differs from the captured one" in caplog.text


def _timed(figures, drift=0.0):
    """A stand-in for a timer: ``figures`` (direct run, replay) by what the call ran (a replay
    counts one on FakeGraph), each ``1 + drift`` times the one timed before it (a clock falling)."""
    timed = []

    def seconds(call, device, *hold):
        replays = FakeGraph.replays
        call()
        timed.append(None)
        return figures[FakeGraph.replays > replays] * (1 + drift) ** (len(timed) - 1)
    return seconds


@pytest.mark.parametrize("wall,gpu,kept", [
    ((1.0, 0.5), (1.0, 1.01), True),  # faster on the wall clock, copies within the slack
    ((1e-3, 5e-4), (1e-4, 1.1e-4), True),  # a graph of microseconds: its copies' few µs allowed
    ((1.0, 1.01), (1.0, 1.0), True),  # GPU-bound: as fast on the wall clock but for noise
    ((1.0, 1.05), (1.0, 1.0), False),  # slower on the wall clock
    ((1.0, 0.5), (1.0, 1.1), False),  # faster alone, but its copies add GPU time
])
def test_a_replay_that_does_not_pay_is_dropped(monkeypatch, caplog, wall, gpu, kept):
    """Right after the capture, the graph run directly and its replay are timed alternating, on
    the wall clock and in GPU time; a replay slower on the first (beyond WALL_SLACK), or adding more than
    GPU_SLACK on the second, is dropped with a log line and later calls run the graph directly."""
    monkeypatch.setattr(cudagraphs._ShapeGraph, "_replay_pays", REPLAY_PAYS)  # the real one, timed by
    monkeypatch.setattr(cudagraphs, "_seconds", _timed(wall))
    monkeypatch.setattr(cudagraphs, "_gpu_seconds", _timed(gpu))
    w, b = torch.randn(4, 8), torch.randn(8)
    fn = Counted()
    runner = CudaGraphRunner(fn)
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        for _ in range(WARMUP + 1):
            runner(torch.randn(4, 8), w, b)
    timed_runs = 2 * cudagraphs.PAY_ROUNDS  # each of wall and GPU time: a direct run and a replay a round
    # warm-ups, the side-stream run, the capture, the direct runs timed, then the call itself
    assert fn.runs == WARMUP + 2 + timed_runs + (0 if kept else 1)
    # the untimed first launch (the graph's upload), the timed replays, then the call itself
    assert FakeGraph.replays == 1 + timed_runs + (1 if kept else 0)
    assert ("CUDA graph dropped" in caplog.text) is not kept
    x, runs = torch.randn(4, 8), fn.runs
    out = runner(x, w, b)[0]
    assert FakeGraph.replays == 1 + timed_runs + (2 if kept else 0)
    assert fn.runs == runs + (0 if kept else 1)
    assert kept or torch.equal(out, x * w + b)  # (a fake replay computes nothing)


def test_a_drift_of_the_clocks_weighs_on_the_direct_run_and_the_replay_alike(monkeypatch):
    """Each timing 3% slower than the one before (a power-capped GPU warming up), the replay as fast
    as the direct run: timed in balanced order (direct, replay, replay, direct) the replay is kept,
    where timed second every round it would read about 3% slower than the direct run, past the
    2% slack."""
    assert cudagraphs.WALL_SLACK < 0.03 and cudagraphs.PAY_ROUNDS % 2 == 0
    monkeypatch.setattr(cudagraphs._ShapeGraph, "_replay_pays", REPLAY_PAYS)
    monkeypatch.setattr(cudagraphs, "_seconds", _timed((0.5, 0.5), drift=0.03))
    monkeypatch.setattr(cudagraphs, "_gpu_seconds", _timed((0.5, 0.5), drift=0.03))
    w, b = torch.randn(4, 8), torch.randn(8)
    runner = CudaGraphRunner(Counted())
    for _ in range(WARMUP + 1):
        runner(torch.randn(4, 8), w, b)
    replays = FakeGraph.replays
    runner(torch.randn(4, 8), w, b)
    assert FakeGraph.replays == replays + 1  # kept: the call replays


def test_a_graphs_first_launch_is_not_timed(monkeypatch):
    """A graph's first launch uploads it (a Wan 2.1 step's graph: thousands of nodes) and is slow:
    it runs once before the timing, so a replay as fast as the direct run afterwards is kept."""
    monkeypatch.setattr(cudagraphs._ShapeGraph, "_replay_pays", REPLAY_PAYS)

    def timed(call):
        replays = FakeGraph.replays
        call()
        return 10.0 if FakeGraph.replays > replays == 0 else 0.5  # the first launch: 20x

    monkeypatch.setattr(cudagraphs, "_seconds", lambda call, device: timed(call))
    monkeypatch.setattr(cudagraphs, "_gpu_seconds", lambda call, device, hold: timed(call))
    w, b = torch.randn(4, 8), torch.randn(8)
    runner = CudaGraphRunner(Counted())
    for _ in range(WARMUP + 1):
        runner(torch.randn(4, 8), w, b)
    replays = FakeGraph.replays
    runner(torch.randn(4, 8), w, b)
    assert FakeGraph.replays == replays + 1  # kept: the call replays


def test_balanced_means_reverse_every_other_round():
    order = []
    means = cudagraphs.balanced_means((lambda: "a", lambda: "b"), lambda call: order.append(call()) or len(order))
    assert order == ["a", "b", "b", "a"][:2 * cudagraphs.PAY_ROUNDS] and means == [2.5, 2.5]


def _graph_running(*ops):
    """A GraphModule whose lowering left ``ops`` in it (what the runner reads)."""
    gm = torch.fx.symbolic_trace(lambda x, w, b: x * w + b)
    gm.meta["sgdiff_ops"] = ops
    return gm


@pytest.mark.parametrize("ops,watched", [(("linear_fp8",), True), (("residual_gate",), False), ((), False)])
def test_an_in_place_weight_change_is_captured_again_where_an_op_caches_a_copy(caplog, ops, watched):
    w, b = torch.randn(4, 8), torch.randn(8)
    fn = Counted()
    runner = CudaGraphRunner(fn, _graph_running(*ops))
    assert runner.watch_versions is watched
    for _ in range(WARMUP + 1):
        runner(torch.randn(4, 8), w, b)
    assert runner.captures == 1
    w.add_(1.0)  # same address, a new version: a cached FP8 copy of w would be stale
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        runner(torch.randn(4, 8), w, b)
    assert ("changed in place since the capture" in caplog.text) is watched
    assert FakeGraph.replays == (1 if watched else 2)  # watched: warm-up calls again, no replay
    if watched:
        for _ in range(WARMUP):
            runner(torch.randn(4, 8), w, b)
        assert runner.captures == 2


def test_a_failed_capture_hands_each_cuda_generator_a_fresh_copy_of_its_state(monkeypatch):
    """A failed capture skips the generators' epilogue; left alone, the next random draw on the
    device raises. The capture helper re-seats the capturing device's default generator on a
    clone of its state, and only where the capture failed."""
    from sgdiff import _compat

    class Generator:
        def __init__(self):
            self.state = "capturing"

        def clone_state(self):
            return f"clone of {self.state}"

        def graphsafe_set_state(self, state):
            self.state = state

    generators = (Generator(), Generator())
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # the capture's device
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **kwargs: contextlib.nullcontext())
    with pytest.raises(RuntimeError, match="synchronize"):
        with _compat.cuda_graph_capture(object()):
            raise RuntimeError("operation not permitted when stream is capturing (synchronize)")
    assert [g.state for g in generators] == ["capturing", "clone of capturing"]  # another device's: untouched
    with _compat.cuda_graph_capture(object(), capture_error_mode="thread_local"):
        pass
    assert [g.state for g in generators] == ["capturing", "clone of capturing"]
