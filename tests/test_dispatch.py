"""Runtime choice of an implementation: first-sight verification, settled choices per
signature, fallbacks. CPU "kernels" registered for the test stand in for Triton ones."""
import pytest
import torch

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.residual_gate import residual_gate, residual_gate_reference
from sgdiff.tiers import Contract

calls = {"can_use": 0, "kernel": 0}
mode = {"value": "exact"}


def fake_kernel(*args):
    calls["kernel"] += 1
    if mode["value"] == "raise":
        raise RuntimeError("launch failed")
    out = residual_gate_reference(*args)
    return out + 1 if mode["value"] == "wrong" else out


def fake_can_use(residual, *args):
    calls["can_use"] += 1
    return residual.dim() == 3


fake_kernel.can_use = fake_can_use


@pytest.fixture
def cpu_kernel():
    calls.update(can_use=0, kernel=0)
    mode["value"] = "exact"
    spec = registry.register_kernel(registry.KernelSpec(
        "residual_gate", "fake", Contract.BITEXACT, "tests.test_dispatch:fake_kernel",
        devices=frozenset({"cpu"}), priority=100))
    dispatch.reset()
    yield
    registry._SPECS["residual_gate"].remove(spec)
    dispatch.reset()


def args(S=4, D=8):
    return torch.randn(2, S, D), torch.randn(2, 1, D), torch.randn(2, S, D), False, True, None, None, None  # as the op passes them


def test_a_signature_is_verified_once_then_settled(cpu_kernel):
    a = args()
    assert torch.equal(residual_gate(*a), residual_gate_reference(*a))
    assert calls == {"can_use": 1, "kernel": 1}  # first sight: checked, run, compared
    for _ in range(3):
        b = args()  # same signature, new values
        assert torch.equal(dispatch.run("residual_gate", *b), residual_gate_reference(*b))
    assert calls == {"can_use": 1, "kernel": 4}  # settled: no checks, no reference
    c = args(S=5)  # a new signature is checked and verified again
    dispatch.run("residual_gate", *c)
    assert calls == {"can_use": 2, "kernel": 5}
    assert len([k for k in dispatch._verified if k[1] == "fake"]) == 2


def test_inputs_the_kernel_refuses_run_the_reference(cpu_kernel):
    r, g, u = torch.randn(4, 8), torch.randn(1, 8), torch.randn(4, 8)
    for _ in range(2):
        assert torch.equal(dispatch.run("residual_gate", r, g, u, False, True), r + g * u)
    assert calls["kernel"] == 0 and calls["can_use"] == 1  # the refusal is settled too


def test_a_wrong_kernel_is_caught_and_disabled_alone(cpu_kernel, caplog):
    mode["value"] = "wrong"
    a = args()
    with caplog.at_level("WARNING", logger="sgdiff"):
        got = dispatch.run("residual_gate", *a)
        dispatch.run("residual_gate", *args())
    assert torch.equal(got, residual_gate_reference(*a))
    assert list(dispatch.disabled()) == [("residual_gate", "fake")]
    assert "not bit-exact" in caplog.text and caplog.text.count("disabled") == 1


def test_a_settled_kernel_that_raises_falls_back(cpu_kernel, caplog):
    dispatch.run("residual_gate", *args())  # verified and settled
    mode["value"] = "raise"
    a = args()
    with caplog.at_level("WARNING", logger="sgdiff"):
        assert torch.equal(dispatch.run("residual_gate", *a), residual_gate_reference(*a))
    assert "raised RuntimeError: launch failed" in dispatch.disabled()[("residual_gate", "fake")]


def test_without_verification_nothing_is_settled(cpu_kernel):
    with dispatch.verification(False):
        dispatch.run("residual_gate", *args())
        dispatch.run("residual_gate", *args())
    assert calls == {"can_use": 2, "kernel": 2} and not dispatch._verified
    dispatch.run("residual_gate", *args())  # verification back on: verified at first sight
    assert len(dispatch._verified) == 1
