"""The torch.compile backend: entry point, options, capture modes, fallbacks, registry hygiene."""
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import sgdiff
from sgdiff.backend import SgdiffBackend
from sgdiff.options import Options


class Block(torch.nn.Module):
    """Two adaLN-modulated norms, like one DiT block (optionally with a graph break)."""

    def __init__(self, dim=16, graph_break=False):
        super().__init__()
        self.proj = torch.nn.Linear(dim, 4 * dim)
        self.norm = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.graph_break = graph_break

    def forward(self, x, emb):
        shift1, scale1, shift2, scale2 = self.proj(F.silu(emb)).chunk(4, dim=1)
        h = self.norm(x) * (1 + scale1[:, None]) + shift1[:, None]
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.norm(h) * (1 + scale2.unsqueeze(1)) + shift2.unsqueeze(1)


def inputs(B=2, S=8, D=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, S, D, generator=g, dtype=dtype), torch.randn(B, D, generator=g, dtype=dtype)


def compile_with_results(model, **kw):
    results = []
    backend = SgdiffBackend(Options.parse(kw.pop("options", None)), on_result=results.append)
    return torch.compile(model, backend=backend, **kw), results


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode", "enabled"])
def test_bitwise_equal_under_each_grad_mode(fullgraph, grad_mode):
    model = Block().eval()
    x, emb = inputs()
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
           "enabled": torch.enable_grad}[grad_mode]
    compiled, results = compile_with_results(model, fullgraph=fullgraph)
    with ctx():
        want = model(x, emb)
        got = compiled(x, emb)
    assert torch.equal(got, want)
    assert sum(r.counts["modulate"] for r in results) == 2


def test_graph_breaks_give_one_graph_per_piece():
    model = Block(graph_break=True).eval()
    x, emb = inputs()
    compiled, results = compile_with_results(model)
    with torch.no_grad():
        assert torch.equal(compiled(x, emb), model(x, emb))
    assert [r.counts["modulate"] for r in results] == [1, 1]


def test_a_tensor_compared_with_a_string_stays_in_one_graph():
    """``tensor == "text"`` is False and ``!=`` True (a causal VAE's cache sentinel): one graph, no
    break, on every supported torch (the compat shim teaches older dynamo the constant)."""
    def step(x, cache):
        for entry in cache:
            if entry is not None and entry != "Rep":
                x = x + entry
            if entry == "Rep":
                x = x * 3
        return torch.sigmoid(x)

    x = torch.randn(4, 8)
    for cache in ([x.clone(), "Rep", None], ["Rep"], [x * 2]):
        compiled, results = compile_with_results(step, fullgraph=True)
        torch._dynamo.reset()
        assert torch.equal(compiled(x, cache), step(x, cache))
        assert len(results) == 1


def test_dynamic_shapes_recompile_nothing_and_stay_equal():
    model = Block().eval()
    compiled, results = compile_with_results(model, dynamic=True)
    with torch.no_grad():
        for shape in [(2, 8, 16), (3, 5, 16), (4, 11, 16)]:  # no size 1: dynamo specializes it
            x, emb = inputs(*shape)
            assert torch.equal(compiled(x, emb), model(x, emb))
    assert len(results) == 1 and results[0].counts["modulate"] == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    model = Block().to(dtype).eval()
    x, emb = inputs(dtype=dtype)
    with torch.no_grad():
        assert torch.equal(torch.compile(model, backend="sgdiff")(x, emb), model(x, emb))


def test_nothing_to_rewrite_runs_unchanged():
    fn = lambda x: torch.sin(x) * 2  # noqa: E731
    compiled, results = compile_with_results(fn)
    x = torch.randn(5)
    assert torch.equal(compiled(x), fn(x))
    assert all(n == 0 for n in results[0].counts.values())


@pytest.mark.parametrize("mode,op", [("nearest", "upsample_nearest2d"), ("nearest-exact", "_upsample_nearest_exact2d"),
                                     ("bilinear", "upsample_bilinear2d")])
def test_interpolation_is_captured_as_the_kernel_eager_runs(mode, op):
    """``F.interpolate`` reaches the graph as the ATen op eager dispatches to, not as torch's
    Python decomposition of it (an index computation): a VAE decode runs eager's kernels; the
    decompositions are back in place afterwards."""
    from torch._C import DispatchKey

    from sgdiff import _compat

    def upsample(x):
        return F.interpolate(x, scale_factor=2.0, mode=mode) + 1

    targets = []

    def record(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return _compat.boxed(gm.forward)

    x = torch.randn(1, 3, 5, 7)
    with torch.no_grad():
        out = torch.compile(upsample, backend=_compat.aot_capture(record))(x)
    assert torch.equal(out, upsample(x))
    assert f"aten.{op}.default" in targets and not any("index" in t for t in targets), targets
    assert DispatchKey.CompositeImplicitAutograd in getattr(torch.ops.aten, op).vec.py_kernels


def test_reduce_overhead_mode_is_accepted():
    model = Block().eval()
    x, emb = inputs()
    with torch.no_grad():
        out = torch.compile(model, backend="sgdiff", mode="reduce-overhead")(x, emb)
    assert torch.equal(out, model(x, emb))
    assert Options.parse(mode="reduce-overhead").cudagraphs


@pytest.mark.parametrize("mode,cudagraphs", [(None, True), ("default", True), ("reduce-overhead", True),
                                             ("max-autotune", True), ("max-autotune-no-cudagraphs", False)])
def test_inductors_mode_names_have_a_meaning(mode, cudagraphs):
    """CUDA graphs are on by default; diffusers' docs recommend mode="max-autotune": it compiles,
    CUDA graphs on as in Inductor; only "max-autotune-no-cudagraphs" turns them off."""
    assert Options.parse(mode=mode).cudagraphs is cudagraphs
    model, (x, emb) = Block().eval(), inputs()
    with torch.no_grad():
        assert torch.equal(torch.compile(model, backend="sgdiff", mode=mode)(x, emb), model(x, emb))


def test_an_explicit_cudagraphs_option_wins_over_the_mode():
    assert not Options.parse({"cudagraphs": False}).cudagraphs
    assert not Options.parse({"cudagraphs": False}, "reduce-overhead").cudagraphs
    assert Options.parse({"cudagraphs": True}, "max-autotune-no-cudagraphs").cudagraphs


@pytest.mark.parametrize("options,mode,message", [
    ({"qualty": "high"}, None, "unknown sgdiff option.*'qualty'.*valid: quality, cudagraphs"),
    ({"quality": "medium"}, None, "unknown sgdiff quality 'medium'; valid: 'lossless', 'extra-high', 'high'"),
    ({}, "max-speed", "unknown sgdiff mode 'max-speed'; valid: None, 'default', 'reduce-overhead', 'max-autotune'"),
    ({"families": ["modulate", "norms"]}, None, "unknown chain family.*norms.*valid: .*modulate"),
    ({"cudagraphs": "yes"}, None, "must be True or False"),
])
def test_bad_options_are_value_errors_naming_valid_values(options, mode, message):
    with pytest.raises(ValueError, match=message):
        Options.parse(options, mode)


def test_bad_options_surface_through_torch_compile():
    """torch.compile hands options to a backend at the first call: the ValueError comes then,
    inside torch's BackendCompilerFailed (sgdiff.optimize raises it at once)."""
    compiled = torch.compile(lambda x: x + 1, backend="sgdiff", options={"quality": "medium"})
    with pytest.raises(Exception) as info:
        compiled(torch.ones(2))
    assert "valid: 'lossless', 'extra-high', 'high'" in str(info.value)
    assert isinstance(info.value.__cause__ or info.value, ValueError) or "ValueError" in str(info.value)


def test_optimize_decorator_on_function_and_module():
    model = Block().eval()
    x, emb = inputs()

    @sgdiff.optimize
    def forward(x, emb):
        return model(x, emb)

    opt_model = sgdiff.optimize(model, quality="extra-high")
    with torch.no_grad():
        assert torch.equal(forward(x, emb), model(x, emb))
        assert torch.equal(opt_model(x, emb), model(x, emb))
    with pytest.raises(ValueError, match="valid"):
        sgdiff.optimize(quality="best")


def test_families_option_restricts_rewrites():
    model = Block().eval()
    x, emb = inputs()
    compiled, results = compile_with_results(model, options={"families": ["residual_gate"]})
    with torch.no_grad():
        assert torch.equal(compiled(x, emb), model(x, emb))
    assert "modulate" not in results[0].counts


def test_explain_reports_counts_and_a_table():
    model = Block().eval()
    report = sgdiff.explain(model, *inputs())
    assert report.counts["modulate"] == 2
    assert set(report.counts) >= {"modulate", "residual_gate", "rope", "qk_norm", "activation"}
    text = str(report)
    assert "modulate" in text and "layernorm_modulate" in text and "bitexact" in text


def test_explain_lists_an_op_under_the_family_that_rewrote_it():
    """``layer_norm`` serves several families; AuraFlow's QK norms (fp32: plain LayerNorms) are the
    qk_norm family's, and its table row says so, while no modulate row claims the op."""
    from sgdiff import zoo

    model, kwargs = zoo.build("auraflow", dtype=torch.float32)
    report = sgdiff.explain(model, **kwargs)
    assert report.family_ops["qk_norm"] == {"layer_norm": 6}, report.family_ops
    assert "layer_norm" not in report.family_ops["modulate"], report.family_ops
    row = next(line for line in str(report).splitlines() if line.strip().startswith("qk_norm"))
    assert "layer_norm" in row, str(report)


@pytest.mark.parametrize("explained", ["module", "compiled"])
def test_explain_leaves_a_compiled_model_compiled(explained):
    """Compile, call, explain (the module or the compiled model), call again: the compiled
    model does not recompile, its outputs stay equal, and the report is a fresh compile's."""
    model = Block().eval()
    x, emb = inputs()
    compiles = []
    compiled = torch.compile(model, backend=SgdiffBackend(Options(), on_result=compiles.append))
    with torch.no_grad():
        first = compiled(x, emb)
        report = sgdiff.explain(model if explained == "module" else compiled, x, emb)
        again = compiled(x, emb)
    assert len(compiles) == 1  # compiled once, before the explain
    assert report.counts["modulate"] == 2 and report.graphs == 1
    assert torch.equal(first, again) and torch.equal(again, model(x, emb))


def test_explaining_one_model_again_and_again_reports_each_time():
    """Each explain is a compile of its own, past torch.compile's recompile limit (8) too, and
    leaves the model's own compiled copy its room to recompile (here for another shape)."""
    model, args = Block().eval(), inputs()
    compiles = []
    compiled = torch.compile(model, backend=SgdiffBackend(Options(), on_result=compiles.append))
    with torch.no_grad():
        compiled(*args)
        assert [(r.graphs, r.counts["modulate"]) for r in (sgdiff.explain(model, *args) for _ in range(10))] == \
            [(1, 2)] * 10
        other = inputs(S=12)
        assert torch.equal(compiled(*other), model(*other))
    assert len(compiles) == 2  # the first shape, then the second: not refused for the explains' entries


def test_explain_says_why_there_are_several_graphs():
    report = sgdiff.explain(Block(graph_break=True).eval(), *inputs())
    assert report.graphs == 2 and len(report.graph_breaks) == 1
    assert "2 graph(s) (1 kind(s) of graph break: Call to `torch._dynamo.graph_break()`" in str(report)
    assert not sgdiff.explain(Block().eval(), *inputs()).graph_breaks


def test_a_skip_says_what_admits_the_site_and_where_it_is(example_pattern):
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.ModuleDict({"inner": MulAdd()})])

        def forward(self, a, b, c):
            return self.blocks[1]["inner"](a, b, c)

    args = tuple(torch.randn(4, 8, dtype=torch.bfloat16) for _ in range(3))
    report = sgdiff.explain(Outer(), *args)
    (family, op, reason), = set(report.skipped)
    assert reason.startswith("contract close is not admitted at lossless") and "quality='extra-high' admits it" in reason
    where = report.skipped_where[(family, op, reason)]
    assert where.startswith("blocks.1.inner (test_backend.py:") and where.endswith(")"), where
    assert f"first at {where}" in str(report)


class MulAdd(torch.nn.Module):
    def forward(self, a, b, c):
        return a * b + c


def test_failing_pass_falls_back_to_the_captured_graph(monkeypatch, caplog):
    from sgdiff.fxpasses import manager

    def boom(self, gm):
        raise RuntimeError("injected")

    monkeypatch.setattr(manager.PassManager, "apply", boom)
    model = Block().eval()
    x, emb = inputs()
    with torch.no_grad(), caplog.at_level("ERROR", logger="sgdiff"):
        assert torch.equal(torch.compile(model, backend="sgdiff")(x, emb), model(x, emb))
    assert "running it unchanged" in caplog.text


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_backend_found_by_name_without_importing_sgdiff():
    out = _run("""
        import sys, torch
        f = torch.compile(lambda x: x * 2 + 1, backend="sgdiff")
        print(f(torch.ones(2)).tolist(), "sgdiff.backend" in sys.modules)
    """)
    assert out.strip() == "[3.0, 3.0] True"


def test_backend_found_by_name_after_importing_sgdiff():
    out = _run("""
        import torch, sgdiff
        sgdiff.explain  # loads the api and backend modules
        f = torch.compile(lambda x: x * 2 + 1, backend="sgdiff")
        g = torch.compile(lambda x: x * 3, backend="sgdiff")
        print(f(torch.ones(2)).tolist(), g(torch.ones(1)).tolist())
    """)
    assert out.strip() == "[3.0, 3.0] [3.0]"


def test_declaring_the_ops_pulls_in_no_kernel():
    """The registry finds every op in its module's declaration; none imports Triton or an
    implementation module until one is asked for."""
    out = _run("""
        import sys
        import sgdiff.kernels.registry as r
        assert r.kernel_specs("layernorm_modulate") and len(r.ops()) >= 19
        loaded = [m for m in sys.modules if m == "triton" or m.startswith("triton.")
                  or m.startswith("sgdiff.kernels.triton")]
        print(loaded)
    """)
    assert out.strip() == "[]"


def test_executed_graph_calls_the_reference_directly_where_nothing_is_faster():
    from sgdiff.fxpasses.lowering import lower_to_call_sites
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
    from tests.capture import rewrite

    fn = lambda x, s: F.layer_norm(x, x.shape[-1:]) * (1 + s)  # noqa: E731
    args = (torch.randn(2, 4, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["modulate"])
    assert result.counts["modulate"] == 1
    assert lower_to_call_sites(gm) == 1  # on CPU only the reference exists: no dispatch at all
    assert layernorm_modulate_reference in [n.target for n in gm.graph.nodes]
    assert torch.equal(run(*args), fn(*args))


def test_diffusers_regional_compile_rewrites_each_block():
    pytest.importorskip("diffusers")
    from sgdiff import zoo

    model, kwargs = zoo.build("flux", "tiny", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(**kwargs)[0]
        results = []
        model.compile_repeated_blocks(backend=SgdiffBackend(Options(), on_result=results.append))
        got = model(**kwargs)[0]
    assert torch.equal(got, want)
    families = ("modulate", "residual_gate", "rope", "qk_norm")
    per_block = sorted(tuple(r.counts[f] for f in families) for r in results)
    # a Flux double block: 4 modulates, 4 gated residuals, RoPE on q and k, 4 QK-norms;
    # a single block: 1, 1, 2, 2
    assert per_block == [(1, 1, 2, 2), (4, 4, 2, 4)]


def test_an_implementation_that_cannot_load_falls_back_with_one_warning(caplog):
    from sgdiff.kernels import dispatch, registry
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate
    from sgdiff.tiers import Contract

    spec = registry.register_kernel(registry.KernelSpec(
        "layernorm_modulate", "missing", Contract.BITEXACT, "sgdiff_no_such_module:kernel",
        devices=frozenset({"cpu"}), priority=100))
    try:
        x, s = torch.randn(2, 4, 8), torch.randn(2, 1, 8)
        with caplog.at_level("WARNING", logger="sgdiff"):
            out = layernorm_modulate(x, None, None, 1e-6, s, s, True)
            layernorm_modulate(x, None, None, 1e-6, s, s, True)
        assert torch.equal(out, F.layer_norm(x, (8,), eps=1e-6) * (1 + s) + s)
        assert "could not load sgdiff_no_such_module:kernel" in caplog.text
        assert caplog.text.count("disabled") == 1
    finally:
        registry._SPECS["layernorm_modulate"].remove(spec)
        dispatch.reset()
