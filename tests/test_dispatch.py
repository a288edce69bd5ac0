"""Runtime choice of an implementation: first-sight verification, settled choices per
signature, fallbacks. CPU "kernels" registered for the test stand in for Triton ones."""
import logging

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


def fake_bind(*bound_args):
    """As a Triton module's bind: the launch for this signature, host work done once."""
    calls["bind"] = calls.get("bind", 0) + 1
    shape = bound_args[0].shape

    def launch(*args):
        assert args[0].shape == shape  # a call site's signature holds
        calls["bound"] = calls.get("bound", 0) + 1
        return fake_kernel(*args)

    return launch


def fake_can_use(residual, *args):
    calls["can_use"] += 1
    return residual.dim() == 3


FAKE = registry.Impl(run=fake_kernel, supports=fake_can_use, bind=fake_bind)


@pytest.fixture
def cpu_kernel():
    calls.clear()
    calls.update(can_use=0, kernel=0)
    mode["value"] = "exact"
    spec = registry.register_kernel(registry.KernelSpec(
        "residual_gate", "fake", Contract.BITEXACT, "tests.test_dispatch:FAKE",
        devices=frozenset({"cpu"}), priority=100))
    dispatch.reset()
    yield
    registry._SPECS["residual_gate"].remove(spec)
    dispatch.reset()


def args(S=4, D=8):
    return (torch.randn(2, S, D), torch.randn(2, 1, D), torch.randn(2, S, D), "plain", True, None, None, None,
            None, None)  # as the op passes them


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


def test_inputs_the_kernel_refuses_run_the_reference(cpu_kernel, caplog):
    r, g, u = torch.randn(4, 8), torch.randn(1, 8), torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        for _ in range(2):
            assert torch.equal(dispatch.run("residual_gate", r, g, u, "plain", True), r + g * u)
    assert calls["kernel"] == 0 and calls["can_use"] == 1  # the refusal is settled too
    said = [m for m in caplog.messages if "runs its eager chain" in m]
    assert len(said) == 1 and "residual_gate" in said[0] and "the fake implementation" in said[0], said


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


def test_a_call_site_settles_per_alignment_then_runs_the_bound_launch(cpu_kernel, monkeypatch):
    site = dispatch.CallSite("residual_gate", ((0, None), (1, None), (2, None)))
    signatures = []
    monkeypatch.setattr(dispatch, "signature", lambda a, _s=dispatch.signature: signatures.append(1) or _s(a))
    a = args()
    assert torch.equal(site(*a), residual_gate_reference(*a))  # chosen and verified by run
    assert calls == {"can_use": 1, "kernel": 1, "bind": 1} and len(signatures) == 2
    for _ in range(3):
        b = args()
        assert torch.equal(site(*b), residual_gate_reference(*b))
    assert calls == {"can_use": 1, "kernel": 4, "bind": 1, "bound": 3} and len(signatures) == 2  # no signature
    # another alignment (a storage offset of one element) is another signature: chosen and verified
    r = torch.randn(2 * 4 * 8 + 1)[1:].view(2, 4, 8)
    c = (r, *args()[1:])
    assert torch.equal(site(*c), residual_gate_reference(*c))
    assert calls["can_use"] == 2 and calls["bind"] == 2 and len(dispatch._verified) == 2


def test_a_call_site_forgets_what_a_disabled_kernel_settled(cpu_kernel, caplog):
    site = dispatch.CallSite("residual_gate", ((0, None), (1, None), (2, None)))
    site(*args())
    site(*args())
    assert calls["bound"] == 1
    mode["value"] = "raise"  # the bound launch raises: disabled, the reference answers
    a = args()
    with caplog.at_level("WARNING", logger="sgdiff"):
        assert torch.equal(site(*a), residual_gate_reference(*a))
    assert "raised RuntimeError: launch failed" in dispatch.disabled()[("residual_gate", "fake")]
    mode["value"] = "exact"
    kernel_calls = calls["kernel"]
    for _ in range(2):
        a = args()
        assert torch.equal(site(*a), residual_gate_reference(*a))
    assert calls["kernel"] == kernel_calls  # the site settled the reference now


def test_a_call_site_forgets_after_a_reset(cpu_kernel):
    site = dispatch.CallSite("residual_gate", ((0, None), (1, None), (2, None)))
    site(*args())
    dispatch.reset()  # (as disabling any implementation does) nothing settled survives
    site(*args())
    assert calls["can_use"] == 2 and calls["bind"] == 2


def test_during_a_capture_or_without_verification_a_site_settles_nothing(cpu_kernel):
    site = dispatch.CallSite("residual_gate", ((0, None), (1, None), (2, None)))
    with dispatch.verification(False):
        site(*args())
        site(*args())
    assert calls == {"can_use": 2, "kernel": 2} and not site._settled


def test_lowering_gives_each_static_site_its_own_launcher(cpu_kernel):
    from sgdiff.fxpasses.lowering import lower_to_call_sites
    from tests.capture import rewrite

    def fn(x, y, g):
        x = x + g * y
        return x + g * (y * 2)

    a = (torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 1, 8))
    for dynamic in (False, True):
        run, gm, result = rewrite(fn, a, families=["residual_gate"], dynamic=dynamic)
        assert result.counts["residual_gate"] == 2
        assert lower_to_call_sites(gm) == 2
        sites = [n.target for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__.startswith("sgdiff_")]
        assert len(sites) == 2
        if dynamic:  # symbolic sizes: a signature can change between calls, the op's launcher serves
            assert all(t is dispatch.runner("residual_gate") for t in sites)
        else:
            assert all(isinstance(t, dispatch.CallSite) for t in sites) and sites[0] is not sites[1]
        for _ in range(2):
            assert torch.equal(run(*a), fn(*a))


def fake_close_kernel(x, weight, bias):
    calls["close"] = calls.get("close", 0) + 1
    from sgdiff.kernels.linear_gelu_tanh import linear_gelu_tanh_reference
    return linear_gelu_tanh_reference(x, weight, bias) + 1e-3  # close, never bit-exact


def fake_close_can_use(*args):
    calls["close_can_use"] = calls.get("close_can_use", 0) + 1
    return True


FAKE_CLOSE = registry.Impl(run=fake_close_kernel, supports=fake_close_can_use)


def test_a_close_kernel_is_settled_without_verification():
    """A ``close`` op's kernel has no bits to match: its first accepted signature is settled
    as it is (no reference run, nothing disabled), and later calls skip ``can_use``."""
    calls.clear()
    spec = registry.register_kernel(registry.KernelSpec(
        "linear_gelu_tanh", "fake", Contract.CLOSE, "tests.test_dispatch:FAKE_CLOSE",
        devices=frozenset({"cpu"}), priority=100))
    dispatch.reset()
    try:
        for _ in range(3):
            x, w, b = torch.randn(2, 5, 8), torch.randn(12, 8), torch.randn(12)
            from sgdiff.kernels.linear_gelu_tanh import linear_gelu_tanh_reference
            assert torch.equal(dispatch.run("linear_gelu_tanh", x, w, b), linear_gelu_tanh_reference(x, w, b) + 1e-3)
        assert calls == {"close": 3, "close_can_use": 1}
        assert not dispatch.disabled() and not dispatch._verified
    finally:
        registry._SPECS["linear_gelu_tanh"].remove(spec)
        dispatch.reset()


def test_tensor_positions_are_what_a_call_site_reads(cpu_kernel):
    a = args()
    assert dispatch.tensor_positions(a) == ((0, None), (1, None), (2, None))
    assert dispatch.tensor_positions((a[0], [a[1], 2, a[2]], 3.0, None)) == ((0, None), (1, 0), (1, 2))
    site = dispatch.CallSite("residual_gate", dispatch.tensor_positions(a))  # bench/kernels.py's call site
    assert torch.equal(site(*a), residual_gate_reference(*a))
