"""CUDA graphs (on by default): replay stays bitwise equal to eager, step after step, shape
after shape, tier after tier."""
import pytest
import torch

import sgdiff
from sgdiff import zoo
from sgdiff.fxpasses import cudagraphs
from sgdiff.kernels import dispatch

pytestmark = pytest.mark.gpu
pytest.importorskip("diffusers")


@pytest.fixture
def captures(monkeypatch):
    """How many CUDA graphs sgdiff captured during the test."""
    count = [0]
    capture = cudagraphs.CudaGraphRunner.capture

    def counted(self, static):
        count[0] += 1
        return capture(self, static)

    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "capture", counted)
    return count


def test_the_default_call_replays_and_each_call_equals_eager(captures):
    dispatch.reset()
    torch._dynamo.reset()
    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(model, backend="sgdiff")  # no mode, no options
    kept, wanted = [], []
    with torch.no_grad():
        for step in range(6):  # warm-up, warm-up, capture, replays
            inputs = dict(kwargs, hidden_states=torch.randn_like(kwargs["hidden_states"]))
            kept.append(compiled(**inputs)[0])
            wanted.append(model(**inputs)[0])
    for got, want in zip(kept, wanted):
        assert torch.equal(got, want)
    assert captures[0] == 1
    assert not dispatch.disabled()


def test_denoising_trajectory_is_bitwise_equal():
    torch._dynamo.reset()
    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(model, backend="sgdiff", mode="reduce-overhead")

    def euler(fn, steps=8):
        latents = kwargs["hidden_states"].clone()
        trajectory = []
        for i in range(steps):  # flow matching: x <- x + (t_next - t) * v(x, t)
            t, t_next = 1 - i / steps, 1 - (i + 1) / steps
            v = fn(**dict(kwargs, hidden_states=latents, timestep=torch.full_like(kwargs["timestep"], t)))[0]
            latents = latents + (t_next - t) * v
            trajectory.append(latents)
        return trajectory

    with torch.no_grad():
        for a, b in zip(euler(compiled), euler(model)):
            assert torch.equal(a, b)


def test_a_weight_moved_after_the_capture_is_captured_again(caplog, captures):
    """A weight given new storage (``param.data = ...``) after the capture: the graph would read
    the old address, so the runner captures again under the new one; every call equals eager."""
    torch._dynamo.reset()
    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(model, backend="sgdiff")
    with torch.no_grad():
        for _ in range(4):  # warm-up, warm-up, capture, a replay
            compiled(**kwargs)
        weight = model.transformer_blocks[0].norm1.linear.weight
        weight.data = weight.data * 2
        with caplog.at_level("INFO", logger="sgdiff"):
            for _ in range(5):
                assert torch.equal(compiled(**kwargs)[0], model(**kwargs)[0])
    assert "capturing the graph again" in caplog.text
    assert captures[0] == 2


def test_dynamic_shapes_one_compile_a_graph_per_shape(captures):
    """``dynamic=True``: three token counts served by one compile (no recompile), each with a CUDA
    graph of its own, every output equal to eager's."""
    from sgdiff import _compat

    torch._dynamo.reset()
    before = _compat.graphs_compiled()
    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(model, backend="sgdiff", dynamic=True)
    with torch.no_grad():
        for _ in range(4):
            for side in (6, 8, 10):
                inputs = zoo.flux_inputs_at(kwargs, side)
                assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
    assert _compat.graphs_compiled() - before == 1
    assert captures[0] == 3


def test_each_tier_replays_only_its_own_graphs():
    """The tier switched between replays: each output equals that tier's run without CUDA graphs."""
    torch._dynamo.reset()
    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16, device="cuda")
    graphed = torch.compile(model, backend="sgdiff")
    plain = torch.compile(model, backend="sgdiff", options={"cudagraphs": False})
    tiers = ("lossless", "extra-high", "high")
    with torch.no_grad():
        for _ in range(4):
            for tier in tiers:
                inputs = dict(kwargs, hidden_states=torch.randn_like(kwargs["hidden_states"]))
                with sgdiff.quality(tier):
                    got, want = graphed(**inputs)[0], plain(**inputs)[0]
                assert torch.equal(got, want), tier
                if tier == "lossless":
                    assert torch.equal(got, model(**inputs)[0])


def test_soak_300_calls_5_resolutions_no_recompile_flat_memory():
    """The default call, 300 calls cycling 5 token counts: after the warm-up no recompile, the
    memory allocated the same after every cycle, every output equal to eager's."""
    from bench import soak

    case = soak.run(calls=300, sides=(6, 8, 10, 12, 14))
    assert case["unequal"] == 0
    assert case["recompiles_after_warm_up"] == 0
    low, high = case["allocated_mib_range"]
    assert low == high, case["cycles"]


def test_a_model_dynamo_splits_into_frames_captures_each_frame_about_once(captures):
    """HunyuanImage's forward is skipped by Dynamo (a boolean-mask index in a loop) and its blocks
    compile frame by frame with eager code between them: over 12 calls each frame's graph is
    captured at most twice (an activation that moved after the first capture is copied in from
    then on, not captured again at every move), and every call equals eager."""
    dispatch.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, kwargs = zoo.build("hunyuan_image", "tiny", dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(model, backend="sgdiff")
    with torch.no_grad():
        for _ in range(12):
            inputs = dict(kwargs, hidden_states=torch.randn_like(kwargs["hidden_states"]))
            assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 0 < captures[0] <= 2 * frames, (captures[0], frames)
