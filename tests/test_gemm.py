"""Family gemm on the CPU: exact site counts on a Flux of real block structure, equal to eager;
near misses left alone (few rows, fp32, an intermediate read elsewhere, a strided residual)."""
import pytest
import torch
import torch.nn.functional as F

from sgdiff import zoo
from sgdiff.kernels.linear_act import linear_act_reference
from sgdiff.kernels.registry import Impl
from tests.capture import rewrite

BF16 = torch.bfloat16


def _w(n, k):
    return torch.randn(n, k, dtype=BF16) / k ** 0.5


def test_flux_blocks_fold_their_activations_and_gated_residuals():
    """Off by default. With ``gemm``: 2 double blocks x (to_out, add_out, ff, ff_context: 4 gated
    residuals + 2 GELUs) and 4 single blocks x (proj_out + its gate; proj_mlp with the
    gelu_tanh_cat after it, which stores the MLP's GELU into the cat) = 20 sites; the q/k/v GEMMs
    at width 256 are below MIN_PLAIN_FLOP."""
    import sgdiff

    model, kw = zoo.build("flux", size="small", dtype=BF16)
    with torch.no_grad():
        want = model(**kw)[0]
        default = sgdiff.explain(model, **kw)
        report = sgdiff.explain(model, options={"gemm": True}, **kw)
        got = torch.compile(model, backend="sgdiff", options={"gemm": True})(**kw)[0]
    assert default.counts["gemm"] == 0 and default.found["gemm"] == 0
    assert report.counts["gemm"] == 20 and report.found["gemm"] == 20
    assert report.counts["activation"] == default.counts["activation"] == 4  # the single blocks' gelu_tanh_cat
    assert report.family_ops["gemm"] == {"linear_residual_gate": 12, "linear_act": 4, "linear_act_cat": 4}
    assert torch.equal(got, want)


def test_gelu_after_linear():
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(256, 64), torch.randn(256, dtype=BF16)
    for approximate in ("tanh", "none"):
        run, gm, result = rewrite(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate=approximate), [x, w, b],
                                  families=["gemm"])
        assert result.counts["gemm"] == 1
        assert torch.equal(run(x, w, b), F.gelu(F.linear(x, w, b), approximate=approximate))
        assert "sgdiff.linear_act" in gm.code


def _gelu_into_cat(head, x, w, b):
    return torch.cat([head, F.gelu(F.linear(x, w, b), approximate="tanh")], dim=-1)


def test_gelu_stored_into_the_cat_after_linear():
    """Flux single blocks' cat([attn, gelu(proj_mlp(x))]): the activation family's gelu_tanh_cat
    and its projection become one linear_act_cat; a projection read elsewhere, or a GELU of
    another kind, stays apart."""
    head = torch.randn(1, 2, 128, 32, dtype=BF16).transpose(1, 2).flatten(2, 3)
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(256, 64), torch.randn(256, dtype=BF16)
    run, gm, result = rewrite(_gelu_into_cat, [head, x, w, b], families=["activation", "gemm"])
    assert result.counts == {"activation": 1, "gemm": 1} and "sgdiff.linear_act_cat" in gm.code
    assert "gelu_tanh_cat" not in gm.code and "aten.mm" not in gm.code and "addmm" not in gm.code
    assert torch.equal(run(head, x, w, b), _gelu_into_cat(head, x, w, b))

    def read_elsewhere(head, x, w, b):
        y = F.linear(x, w, b)
        return torch.cat([head, F.gelu(y, approximate="tanh")], dim=-1), y.sum()

    run, gm, result = rewrite(read_elsewhere, [head, x, w, b], families=["activation", "gemm"])
    assert "linear_act_cat" not in gm.code and "gelu_tanh_cat" in gm.code
    assert all(torch.equal(a, e) for a, e in zip(run(head, x, w, b), read_elsewhere(head, x, w, b)))

    def erf_gelu(head, x, w, b):
        return torch.cat([head, F.gelu(F.linear(x, w, b))], dim=-1)

    run, gm, result = rewrite(erf_gelu, [head, x, w, b], families=["activation", "gemm"])
    assert "linear_act_cat" not in gm.code and torch.equal(run(head, x, w, b), erf_gelu(head, x, w, b))


def _swiglu(gate_first, bias=True, cat_dim=-1):
    def fn(x, w, b):
        first, second = F.linear(x, w, b if bias else None).chunk(2, dim=cat_dim)
        return F.silu(first) * second if gate_first else first * F.silu(second)
    return fn


@pytest.mark.parametrize("gate_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_swiglu_halves_of_a_linear_are_one_gemm(gate_first, bias):
    """diffusers' SwiGLU (gate second) and Flux.2's (gate first): the activation family's silu_mul
    of the two halves of one projection becomes linear_glu, the projection never written."""
    x, w, b = torch.randn(2, 80, 64, dtype=BF16), _w(192, 64), torch.randn(192, dtype=BF16)
    fn = _swiglu(gate_first, bias)
    run, gm, result = rewrite(fn, [x, w, b], families=["activation", "gemm"])
    assert result.counts == {"activation": 1, "gemm": 1} and result.passes["gemm"].ops == {"linear_glu": 1}
    assert "sgdiff.silu_mul" not in gm.code and "aten.addmm" not in gm.code
    node = next(n for n in gm.graph.nodes if "linear_glu" in str(n.target))
    assert node.args[3] is gate_first
    assert torch.equal(run(x, w, b), fn(x, w, b))


def test_swiglu_near_misses_stay_apart():
    x, w, b = torch.randn(2, 80, 64, dtype=BF16), _w(192, 64), torch.randn(192, dtype=BF16)

    def read_elsewhere(x, w, b):  # the projection read again: fusing would run the GEMM twice
        y = F.linear(x, w, b)
        first, second = y.chunk(2, dim=-1)
        return F.silu(first) * second, y.sum()

    def thirds(x, w, b):  # not two halves of the projection
        first, second, _ = F.linear(x, w, b).split([64, 64, 64], dim=-1)
        return F.silu(first) * second

    for fn in (read_elsewhere, thirds):
        run, gm, result = rewrite(fn, [x, w, b], families=["activation", "gemm"])
        assert result.passes["gemm"].ops.get("linear_glu", 0) == 0, fn.__name__
        want, got = fn(x, w, b), run(x, w, b)
        assert all(torch.equal(a, e) for a, e in zip(got if isinstance(got, tuple) else (got,),
                                                     want if isinstance(want, tuple) else (want,)))


def test_near_misses_are_not_rewritten():
    w, b = _w(256, 64), torch.randn(256, dtype=BF16)
    few = torch.randn(1, 16, 64, dtype=BF16)  # 16 rows: not a site
    _, _, result = rewrite(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), [few, w, b],
                           families=["gemm"])
    assert result.counts["gemm"] == 0 and result.passes["gemm"].found_count == 0
    x32 = torch.randn(1, 128, 64)
    _, _, result = rewrite(lambda x, w, b: F.gelu(F.linear(x, w, b)), [x32, w.float(), b.float()],
                           families=["gemm"])
    assert result.counts["gemm"] == 0 and result.passes["gemm"].found_count == 0  # fp32: not a site
    x = torch.randn(1, 128, 64, dtype=BF16)

    def shared(x, w, b):  # the linear's output read elsewhere: fusing would run the GEMM twice
        y = F.linear(x, w, b)
        return F.gelu(y, approximate="tanh"), y * 2

    run, _, result = rewrite(shared, [x, w, b], families=["gemm"])
    assert result.counts["gemm"] == 0
    assert all(torch.equal(a, e) for a, e in zip(run(x, w, b), shared(x, w, b)))


@pytest.mark.parametrize("contiguous", [True, False])
def test_gated_residual_after_a_projection(contiguous):
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(64, 64), torch.randn(64, dtype=BF16)
    gate = torch.randn(1, 6 * 64, dtype=BF16)
    res = torch.randn(1, 128, 64, dtype=BF16) if contiguous else torch.randn(1, 64, 128, dtype=BF16)

    def block(x, res, gate, w, b):
        r = res if contiguous else res.transpose(1, 2)
        return r + gate.chunk(6, dim=1)[2][:, None] * F.linear(x, w, b)

    args = [x, res, gate, w, b]
    run, _, result = rewrite(block, args, families=["residual_gate", "gemm"])
    assert result.counts["residual_gate"] == 1
    assert result.counts["gemm"] == (1 if contiguous else 0)
    assert torch.equal(run(*args), block(*args))


def _plain_sum(x, res, w, b):
    return res + F.linear(x, w, b)


def _update_first(x, res, w, b):
    return F.linear(x, w, b) + res


def _dropped_out(x, res, w, b):  # an eval Dropout between: traced as a copy on some torch versions
    return res + F.dropout(F.linear(x, w, b), p=0.1, training=False)


def _divided(x, res, w, b):  # Sana's cross-attention: the update / rescale_output_factor (1.0), then + x
    return F.linear(x, w, b) / 1.0 + res


def _two_sites(x, res, w, b):
    y = res + F.linear(x, w, b)
    return y + F.linear(x, w * 2, b)


@pytest.mark.parametrize("fn", [_plain_sum, _update_first, _dropped_out, _divided, _two_sites],
                         ids=lambda f: f.__name__.strip("_"))
def test_ungated_residual_after_a_projection(fn):
    """``residual + linear(x)`` in one 16-bit dtype is ``residual + 1 * linear(x)`` bit for bit:
    linear_residual_gate with a gate of ones, one ``aten.full`` a graph however many sites."""
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(64, 64), torch.randn(64, dtype=BF16)
    res = torch.randn(1, 128, 64, dtype=BF16)
    run, gm, result = rewrite(fn, [x, res, w, b], families=["residual_gate", "gemm"])
    sites = 2 if fn is _two_sites else 1
    assert result.passes["gemm"].ops == {"linear_residual_gate": sites}
    assert result.counts["residual_gate"] == (1 if fn is _divided else 0)  # its residual_add, then the GEMM's
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.full.default) == 1
    assert not {torch.ops.aten.addmm.default, torch.ops.aten.add.Tensor} & set(targets)
    gate = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.full.default)
    assert gate.args == ([64], 1.0) and gate.kwargs["dtype"] == BF16
    assert torch.equal(run(x, res, w, b), fn(x, res, w, b))


def _read_again(x, res, w, b):  # fusing would run the GEMM twice
    y = F.linear(x, w, b)
    return res + y, y.sum()


def test_ungated_residual_near_misses_stay_apart():
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(64, 64), torch.randn(64, dtype=BF16)
    res = torch.randn(1, 128, 64, dtype=BF16)
    cases = {
        "an fp32 residual (the sum promotes)": (lambda x, res, w, b: res.float() + F.linear(x, w, b), res),
        "alpha 2": (lambda x, res, w, b: torch.add(res, F.linear(x, w, b), alpha=2), res),
        "a broadcast residual": (lambda x, res, w, b: res[:, :1] + F.linear(x, w, b), res),
        "a transposed residual": (lambda x, res, w, b: res.transpose(1, 2) + F.linear(x, w, b),
                                  torch.randn(1, 64, 128, dtype=BF16)),
        "divided by 2": (lambda x, res, w, b: F.linear(x, w, b) / 2.0 + res, res),
        "the projection read again": (_read_again, res),
    }
    for reason, (fn, r) in cases.items():
        run, gm, result = rewrite(fn, [x, r, w, b], families=["residual_gate", "gemm"])
        assert result.passes["gemm"].ops.get("linear_residual_gate", 0) == 0, reason
        assert "aten.full" not in gm.code, reason
        want, got = fn(x, r, w, b), run(x, r, w, b)
        assert all(torch.equal(a, e) for a, e in zip(got if isinstance(got, tuple) else (got,),
                                                     want if isinstance(want, tuple) else (want,))), reason


def test_wan_blocks_fold_the_cross_attentions_residual():
    """A Wan block at width 64 and 128 tokens, with ``gemm``: the self-attention's and the
    feed-forward's gated residuals, the cross-attention's ungated one (its to_out, the eval
    Dropout, ``x + attn``), and the GELU-tanh feed-forward: 4 sites, output equal."""
    import sgdiff
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=4,
                                  out_channels=4, text_dim=16, freq_dim=16, ffn_dim=128, num_layers=1,
                                  rope_max_seq_len=32).to(BF16).eval()
    kw = dict(hidden_states=torch.randn(1, 4, 2, 16, 16, dtype=BF16), timestep=torch.full((1,), 500.0),
              encoder_hidden_states=torch.randn(1, 6, 16, dtype=BF16), return_dict=False)
    with torch.no_grad():
        want = model(**kw)[0]
        report = sgdiff.explain(model, options={"gemm": True}, **kw)
        got = torch.compile(model, backend="sgdiff", options={"gemm": True})(**kw)[0]
    assert report.family_ops["gemm"] == {"linear_residual_gate": 3, "linear_act": 1}
    assert torch.equal(got, want)


def test_other_2d_ops_are_no_gemms():
    """The plain GEMM's size test reads a 2-D node's last operand as a weight only where it is
    one: a product by a 0-d tensor (QwenImage 2.1's, SANA-WM's) is no site and no error (an error
    would leave the whole graph without its rewrites)."""
    x, s = torch.randn(128, 64, dtype=BF16), torch.tensor(2.0, dtype=BF16)
    run, _, result = rewrite(lambda x, s: x * s, [x, s], families=["gemm"])
    assert result.counts["gemm"] == 0 and torch.equal(run(x, s), x * s)


def test_the_family_runs_where_the_cute_gemm_does_unless_told(monkeypatch):
    """By default the family runs on a graph whose device runs the CuTe DSL GEMM (a Hopper GPU
    with sgdiff[gemm]), nowhere else; ``gemm`` True or False says so everywhere. The backend asks
    with the graph's device."""
    from sgdiff import backend
    from sgdiff.kernels import cute
    from sgdiff.options import Options

    asked = []
    monkeypatch.setattr(cute, "runs_on", lambda device: asked.append(device) or device.type == "cuda")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert Options.parse({}).gemm is None and Options.parse({"gemm": None}).gemm is None
    assert "gemm" in Options.parse({}).chosen_families(cuda) and "gemm" not in Options.parse({}).chosen_families(cpu)
    assert "gemm" not in Options.parse({}).chosen_families()  # no device known
    assert "gemm" not in Options.parse({"gemm": False}).chosen_families(cuda)
    assert "gemm" in Options.parse({"gemm": True}).chosen_families(cpu)
    assert asked == [cuda, cpu]
    x, w = torch.randn(1, 128, 64), torch.randn(256, 64)
    gm = torch.fx.symbolic_trace(lambda x, w: F.linear(x, w))
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), (x, w)):
        node.meta["val"] = value
    assert backend.graph_device(gm) == cpu
    gm.graph.find_nodes(op="placeholder")[1].meta["val"] = torch.empty(256, 64, device="meta")
    assert backend.graph_device(gm) == cpu  # the first tensor's device where none is on a GPU


def test_the_cute_gemm_runs_only_on_hopper_with_its_packages(monkeypatch):
    from sgdiff.kernels import cute

    assert not cute.runs_on("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, loads, want in (((9, 0), True, True), ((8, 0), True, False), ((10, 0), True, False),
                                    ((9, 0), False, False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        monkeypatch.setattr(cute, "_loads", lambda loads=loads: loads)
        assert cute.runs_on("cuda") is want, capability


def test_the_family_is_off_unless_asked_for():
    from sgdiff.options import Options
    from sgdiff import patterns

    assert "gemm" in patterns.families() and "gemm" not in patterns.default_families()
    assert "gemm" not in Options.parse({}).chosen_families(torch.device("cpu"))
    assert Options.parse({"gemm": True}).chosen_families()[-1] == "gemm"
    assert Options.parse({"families": ["gemm"]}).chosen_families() == ("gemm",)
    assert Options.parse({"families": ["modulate"], "gemm": True}).chosen_families() == ("modulate", "gemm")
    with pytest.raises(ValueError, match="gemm"):
        Options.parse({"gemm": "yes"})
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(256, 64), torch.randn(256, dtype=BF16)
    _, gm, result = rewrite(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), [x, w, b])
    assert "gemm" not in result.passes and "sgdiff.linear_act" not in gm.code  # the pass manager's default


def test_first_sight_keeps_the_reference_within_the_margin(monkeypatch):
    """Same bits, so a candidate replaces the first (the reference) only when it is faster by more
    than tuning.MARGIN; the times themselves order candidates whose durations differ tenfold
    (wall time on the CPU: sleeps)."""
    import time

    from sgdiff.kernels import tuning

    def sleeper(ms):
        return lambda *a: time.sleep(ms / 1e3)

    times = tuning.best_times([sleeper(5.0), sleeper(0.5)], (torch.zeros(1),))
    assert times[1] < times[0] / 3
    for measured, chosen in (([1.0, 0.99], 0), ([1.0, 1.0, 0.97], 2), ([1.0, 1.01, 0.5], 2), ([0.9, 1.0], 0)):
        monkeypatch.setattr(tuning, "best_times", lambda candidates, args, m=measured: list(m))
        assert tuning.fastest([None] * len(measured), ())[0] == chosen, measured


def _two_configurations(x, weight, bias, act):
    """A CPU stand-in for the fused GEMM's configurations: two labelled launches (the
    reference's own math, so its bits)."""
    return [(label, linear_act_reference) for label in ("cfg-a", "cfg-b")]


CPU_GEMM = Impl(run=linear_act_reference, variants=_two_configurations)


@pytest.fixture
def cpu_gemm():
    """CPU_GEMM registered as an implementation of linear_act (so first sight tunes on the CPU),
    choices forgotten before and after."""
    import dataclasses

    from sgdiff.kernels import dispatch, registry

    spec = registry.register_kernel(dataclasses.replace(
        registry.KernelSpec("linear_act", "cpu-gemm", None, f"{__name__}:CPU_GEMM", devices=frozenset({"cpu"}),
                            priority=20), contract=registry.op_def("linear_act").contract))
    dispatch.reset()
    yield
    registry._SPECS["linear_act"].remove(spec)
    registry._generation[0] += 1
    dispatch.reset()


def test_explain_reports_what_first_sight_chose(cpu_gemm):
    """Where an op has implementations of the same bits to choose among, the report lists, per
    signature met during its run, the candidates' times and the choice."""
    import sgdiff

    lin = torch.nn.Linear(64, 256).to(BF16)
    x = torch.randn(1, 128, 64, dtype=BF16)
    report = sgdiff.explain(lambda x: F.gelu(lin(x), approximate="tanh"), x, options={"gemm": True})
    ((op, shapes, chosen, times),) = report.choices
    assert op == "linear_act" and shapes[:2] == ((1, 128, 64), (256, 64))
    assert set(times) == {"reference", "cpu-gemm cfg-a", "cpu-gemm cfg-b"} and chosen
    assert "chosen at first sight" in str(report) and "cpu-gemm cfg-a" in str(report)
    again = sgdiff.explain(lambda x: F.gelu(lin(x), approximate="tanh"), x, options={"gemm": True})
    assert again.choices == []  # settled before this run: not first sight


def test_a_failing_timing_keeps_the_reference(cpu_gemm, monkeypatch, caplog):
    """First sight's timing raising (a GPU it was never run on, say) leaves the reference chosen,
    with one warning, and the op's bits eager's."""
    from sgdiff.kernels import dispatch, registry, tuning

    def broken(candidates, args):
        raise RuntimeError("no timer here")

    monkeypatch.setattr(tuning, "fastest", broken)
    x, w, b = torch.randn(1, 128, 64, dtype=BF16), _w(256, 64), torch.randn(256, dtype=BF16)
    with caplog.at_level("WARNING", logger="sgdiff"):
        got = registry.op_def("linear_act").load()(x, w, b, "silu")
    assert torch.equal(got, F.silu(F.linear(x, w, b)))
    ((_, (chosen, _)),) = [(k, v) for k, v in dispatch.tuned_choices().items() if k[0] == "linear_act"]
    assert chosen == "reference" and "timing linear_act's candidates failed" in caplog.text
