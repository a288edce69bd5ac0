"""LeanKernel: Triton's compiled kernel kept per launch key and launched directly.

The direct path needs a GPU; here a stand-in for a JITFunction records what Triton would be asked
to do, so the keying, the argument order and the fallbacks are checked on every commit. (The GPU
tests run every kernel through it.)"""
import logging

import pytest
import torch

from sgdiff.kernels.triton import launch, triton_compat


def _kernel_fn(x_ptr, out_ptr, n, eps, BLOCK: "constexpr", FLAG: "constexpr" = False):  # noqa: F821
    pass


class FakeCompiled:
    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "fn-handle", "metadata"

    @property
    def run(self):
        return lambda *a: self.log.append(("run", a))


class FakeJIT:
    """What LeanKernel uses of a JITFunction: ``fn``, ``warmup`` and ``[grid]``."""

    def __init__(self):
        self.fn = _kernel_fn
        self.calls = []

    def warmup(self, *args, grid, **kwargs):
        self.calls.append(("warmup", grid, args, kwargs))
        return FakeCompiled(self.calls)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("triton", grid, args, kwargs))


@pytest.fixture
def lean(monkeypatch):
    monkeypatch.setattr(launch, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "raw_stream", lambda device: 1234)
    monkeypatch.setattr(launch, "dependent_launches", lambda device: False)  # a device before Hopper
    kernel = launch.LeanKernel(FakeJIT())
    kernel._direct = True  # as on a GPU, whatever this machine's interpreter setting
    return kernel


def test_first_launch_compiles_then_launches_directly_with_every_parameter_in_order(lean):
    x, out = torch.zeros(8), torch.zeros(8)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16, num_warps=2)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16, num_warps=2)
    calls = lean.fn.calls
    assert [c[0] for c in calls] == ["warmup", "run", "run"]
    assert calls[0][1] == (4,) and calls[0][3] == {"BLOCK": 16, "num_warps": 2}
    # grid padded to 3-D, stream, handle, metadata, no launch metadata or hooks, then the
    # kernel's parameters in order: positional ones, then named ones, defaults filled in
    assert calls[1][1] == (4, 1, 1, 1234, "fn-handle", "metadata", None, None, None, x, out, 8, 1e-6, 16, False)


def test_anything_triton_specializes_on_gets_its_own_compile(lean):
    x, out = torch.zeros(64), torch.zeros(64)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16)
    lean[(4,)](x[1:], out, 8, 1e-6, BLOCK=16)  # another alignment
    lean[(4,)](x.double(), out, 8, 1e-6, BLOCK=16)  # another dtype
    lean[(4,)](x, out, 16, 1e-6, BLOCK=16)  # another int (Triton specializes on % 16)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=32)  # another constexpr
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16, num_warps=8)  # another option
    lean[(2, 2)](x, out, 8, 1e-6, BLOCK=16)  # another grid
    lean[(4,)](x[16:], out, 8, 1e-6, BLOCK=16)  # same alignment as x: no new compile
    assert [c[0] for c in lean.fn.calls].count("warmup") == 7
    assert lean.fn.calls[-1][1][:3] == (4, 1, 1)


def test_launch_hooks_take_tritons_own_path(lean, monkeypatch):
    monkeypatch.setattr(triton_compat._knobs.runtime, "launch_enter_hook", lambda *a: None)
    lean[(4,)](torch.zeros(8), torch.zeros(8), 8, 1e-6, BLOCK=16)
    assert [c[0] for c in lean.fn.calls] == ["triton"]


def test_a_triton_without_these_internals_falls_back_for_good(lean, caplog):
    class Bare(FakeCompiled):
        run = None

        def __getattribute__(self, name):
            if name == "function":
                raise AttributeError(name)
            return object.__getattribute__(self, name)

    lean.fn.warmup = lambda *a, grid, **k: Bare([])
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        lean[(4,)](torch.zeros(8), torch.zeros(8), 8, 1e-6, BLOCK=16)
        lean[(4,)](torch.zeros(8), torch.zeros(8), 8, 1e-6, BLOCK=16)
    assert [c[0] for c in lean.fn.calls] == ["triton", "triton"]
    assert "through Triton's own launcher" in caplog.text


def test_a_compile_error_propagates_as_a_launch_error_would(lean):
    def broken(*a, grid, **k):
        raise RuntimeError("does not compile")

    lean.fn.warmup = broken
    with pytest.raises(RuntimeError, match="does not compile"):
        lean[(4,)](torch.zeros(8), torch.zeros(8), 8, 1e-6, BLOCK=16)
    assert lean._direct  # one input's failure is the dispatcher's business, not the launch path's


def test_the_interpreter_launches_the_usual_way(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", True)
    kernel = launch.LeanKernel(FakeJIT())
    kernel[(4,)](torch.zeros(8), torch.zeros(8), 8, 1e-6, BLOCK=16)
    assert [c[0] for c in kernel.fn.calls] == ["triton"]


@pytest.mark.skipif(not launch.PDL, reason="this Triton has no programmatic launches")
def test_on_hopper_every_launch_is_a_dependent_launch(lean, monkeypatch):
    x, out = torch.zeros(8), torch.zeros(8)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16)
    monkeypatch.setattr(launch, "dependent_launches", lambda device: device == 1)
    monkeypatch.setattr(launch, "current_device", lambda: 1)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16)  # another device, Hopper: its own compile, with the option
    lean.bind((4,), BLOCK=16)(x, out, 8, 1e-6)
    with launch.plain_launches():
        lean[(4,)](x, out, 8, 1e-6, BLOCK=32)  # timed as a plain launch: no option
    monkeypatch.setattr(triton_compat._knobs.runtime, "launch_enter_hook", lambda *a: None)
    lean[(4,)](x, out, 8, 1e-6, BLOCK=16)  # Triton's own launcher: the option too
    calls = [(c[0], c[-1]) for c in lean.fn.calls if c[0] != "run"]
    assert calls == [("warmup", {"BLOCK": 16}), ("warmup", {"BLOCK": 16, "launch_pdl": True}),
                     ("warmup", {"BLOCK": 32}), ("triton", {"BLOCK": 16, "launch_pdl": True})]


def test_the_interpreter_never_asks_for_a_dependent_launch(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", True)
    monkeypatch.setattr(launch, "dependent_launches", lambda device: True)
    assert launch.launch_options({"BLOCK": 16}) == {"BLOCK": 16}
