"""Family `modulate`: LayerNorm(x) * (1 + scale) + shift, in the spellings DiTs use."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from sgdiff.fxpasses import PassManager
from tests import capture
from tests.capture import rewrite
from tests.helpers import bits_equal, count_op, targets

aten = torch.ops.aten
from sgdiff.kernels import registry  # noqa: E402

OP = registry.op_def("layernorm_modulate").load()

FORMS = ["chunk", "split_index", "unsqueeze", "index_after_add", "per_token", "vector", "table_temb"]


def normalize(norm, t, w, b, eps, affine):
    """``norm(t)``: the LayerNorm, F.rms_norm, diffusers' RMSNorm, or no norm at all."""
    if norm == "layer_norm":
        return F.layer_norm(t, t.shape[-1:], w if affine else None, b if affine else None, eps)
    if norm == "F.rms_norm":
        return F.rms_norm(t, t.shape[-1:], w if affine else None, eps)
    if norm == "diffusers":
        return capture.diffusers_rms_norm(t, w if affine else None, eps)
    return t


def make_chain(form, shift=True, swap_mul=False, swap_add=False, affine=False, upcast=False, eps=1e-6,
               norm="layer_norm"):
    """An eager modulate chain spelled the way one diffusers model or another spells it."""

    def params(x, emb, table):
        B, S, D = x.shape
        if form == "chunk":  # Flux/SD3: emb[:, None].chunk(...) -> [B, 1, D] strided views
            sh, sc = emb[:, None].chunk(2, dim=-1)
        elif form == "split_index":
            sh, sc = emb.split(D, dim=1)
            sh, sc = sh[:, None], sc[:, None]
        elif form == "unsqueeze":
            sh, sc = emb.chunk(2, dim=1)
            sh, sc = sh.unsqueeze(1), sc.unsqueeze(1)
        elif form == "index_after_add":  # AdaLayerNormContinuous: (1 + scale)[:, None, :]
            sh, sc = emb.chunk(2, dim=1)
            return sh[:, None, :], sc, "after"
        elif form == "per_token":  # [B, S, D] parameters from a per-token projection
            sh, sc = emb.chunk(2, dim=-1)
        elif form == "vector":
            sh, sc = table[0], table[1]
        elif form == "table_temb":  # Sana/PixArt: (table[None] + temb[:, None]).chunk(2, dim=1)
            sh, sc = (table[None] + emb.reshape(B, 2, D)).chunk(2, dim=1)
        return sh, sc, "before"

    def fn(x, emb, table, w, b):
        sh, sc, where = params(x, emb, table)
        inp = x.float() if upcast else x
        if upcast:  # Wan: (norm(x.float()) * (1 + scale) + shift).type_as(x), fp32 parameters
            sh, sc, w, b = sh.float(), sc.float(), w.float(), b.float()
        n = normalize(norm, inp, w, b, eps, affine)
        factor = (1 + sc)[:, None, :] if where == "after" else 1 + sc
        y = factor * n if swap_mul else n * factor
        if shift:
            y = sh + y if swap_add else y + sh
        return y.type_as(x) if upcast else y

    return fn


def make_args(form, B=2, S=5, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, D, generator=g).to(dtype)
    emb_shape = (B, S, 2 * D) if form == "per_token" else (B, 2 * D)
    emb = torch.randn(*emb_shape, generator=g).to(dtype)
    table = torch.randn(2, D, generator=g).to(dtype)
    w = torch.randn(D, generator=g).to(dtype)
    b = torch.randn(D, generator=g).to(dtype)
    return x, emb, table, w, b


@given(
    form=st.sampled_from(FORMS),
    shift=st.booleans(), swap_mul=st.booleans(), swap_add=st.booleans(),
    affine=st.booleans(), upcast=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    B=st.integers(1, 3), S=st.integers(1, 9), D=st.sampled_from([4, 8, 12, 32, 36]),
    eps=st.sampled_from([1e-6, 1e-5]),
)
def test_every_spelling_is_one_bitexact_site(form, shift, swap_mul, swap_add, affine, upcast, dtype, B, S, D, eps):
    fn = make_chain(form, shift, swap_mul, swap_add, affine, upcast, eps)
    args = make_args(form, B, S, D, dtype)
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 1, result.skipped
    assert count_op(gm, OP) == 1
    assert aten.native_layer_norm.default not in targets(gm)
    assert aten.mul.Tensor not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == OP)
    if upcast and dtype != torch.float32:  # Wan's casts go into the op: it reads x and writes x's dtype
        assert node.args[0].op == "placeholder" and node.args[7:] == (torch.float32, dtype), node.args
    else:  # no casts: the arguments at their defaults (scale_plus_one=True, no casts) are left out
        assert len(node.args) == 6, node.args
    assert bits_equal(run(*args), fn(*args))


LAYER_NORM = registry.op_def("layer_norm").load()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_fp32_layernorm_and_its_casts_are_one_site(dtype, affine):
    # diffusers' FP32LayerNorm (Wan's cross-attention norm):
    # F.layer_norm(x.float(), ..., w.float(), b.float(), eps).to(x.dtype)
    def fn(x, w, b):
        return F.layer_norm(x.float(), x.shape[-1:], w.float() if affine else None, b.float() if affine else None,
                            1e-6).to(x.dtype)

    args = (torch.randn(2, 5, 16, dtype=dtype), torch.randn(16), torch.randn(16))
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 1 and count_op(gm, LAYER_NORM) == 1
    node = next(n for n in gm.graph.nodes if n.target == LAYER_NORM)
    assert node.args[0].op == "placeholder" and node.args[4:] == (torch.float32, dtype)
    assert aten.native_layer_norm.default not in targets(gm) and aten._to_copy.default not in targets(gm)
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("name,fn,sites", [
    ("no cast at all (ATen's LayerNorm stays)", lambda x: F.layer_norm(x, x.shape[-1:]), 0),
    ("an upcast but no cast back", lambda x: F.layer_norm(x.float(), x.shape[-1:]), 0),
    ("the fp32 result has another user", lambda x: (lambda y: (y.to(x.dtype), y))(F.layer_norm(x.float(), x.shape[-1:])), 0),
    ("a narrowing cast before the norm is kept", lambda x: F.layer_norm(x.half(), x.shape[-1:]).float(), 1),
    ("a cast to another device is no cast to fold", lambda x: F.layer_norm(x.float(), x.shape[-1:]).to("meta"), 0),
])
def test_near_misses_of_an_fp32_layernorm(name, fn, sites):
    args = (torch.randn(2, 5, 16, dtype=torch.bfloat16),)
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == sites, name
    if sites:  # the op reads the cast, not x: x_dtype would claim a widening
        node = next(n for n in gm.graph.nodes if n.target == LAYER_NORM)
        assert node.args[0].target == aten._to_copy.default and node.args[4] is None, node.args
    if name.startswith("a cast to another device"):
        return
    got, want = run(*args), fn(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert bits_equal(g, w), name


def test_modulate_result_with_another_user_keeps_its_cast():
    def fn(x, s, b):
        y = F.layer_norm(x.float(), x.shape[-1:]) * (1 + s) + b
        return y.type_as(x), y

    args = (torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(2, 1, 16), torch.randn(2, 1, 16))
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 1
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[0].op == "placeholder" and node.args[7:] == (torch.float32,), node.args  # no out_dtype
    assert count_op(gm, aten._to_copy.default) == 1  # the cast back, for its own user
    assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


def test_affine_layernorm_keeps_its_weight_and_bias():
    fn = make_chain("chunk", affine=True)
    args = make_args("chunk")
    run, gm, result = rewrite(fn, args)
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[1] is not None and node.args[2] is not None
    assert bits_equal(run(*args), fn(*args))
    # the same chain without affine must not carry any weight
    _, gm2, _ = rewrite(make_chain("chunk"), args)
    node2 = next(n for n in gm2.graph.nodes if n.target == OP)
    assert node2.args[1] is None and node2.args[2] is None


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-3])
def test_eps_is_carried_exactly(eps):
    fn = make_chain("unsqueeze", eps=eps)
    args = make_args("unsqueeze")
    run, gm, _ = rewrite(fn, args)
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[3] == eps
    assert bits_equal(run(*args), fn(*args))


def test_one_norm_feeding_two_modulates_is_two_sites():
    def fn(x, e1, e2):
        n = F.layer_norm(x, x.shape[-1:], eps=1e-6)
        a = n * (1 + e1[:, None]) + e2[:, None]
        b = n * (1 + e2[:, None]) + e1[:, None]
        return a, b

    args = (torch.randn(2, 5, 8), torch.randn(2, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 2
    assert count_op(gm, OP) == 2 and aten.native_layer_norm.default not in targets(gm)
    for got, want in zip(run(*args), fn(*args)):
        assert bits_equal(got, want)


def test_intermediate_with_another_user_is_not_swallowed():
    def fn(x, s, b):
        y = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + s[:, None])
        return y + b[:, None], y  # y escapes: the with-shift chain must not be fused

    args = (torch.randn(2, 5, 8), torch.randn(2, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args)
    # what remains fusible is the scale-only chain that produces y
    assert result.counts["modulate"] == 1
    assert any("another user" in s.reason for s in result.skipped)
    assert aten.add.Tensor in targets(gm)  # the shift add stays eager
    for got, want in zip(run(*args), fn(*args)):
        assert bits_equal(got, want)


def test_shared_one_plus_scale_is_recomputed_not_lost():
    def fn(x, s, b):
        t = 1 + s[:, None]
        return F.layer_norm(x, x.shape[-1:], eps=1e-6) * t + b[:, None], t

    args = (torch.randn(2, 5, 8), torch.randn(2, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 1
    for got, want in zip(run(*args), fn(*args)):
        assert bits_equal(got, want)


@pytest.mark.parametrize("name,fn", [
    ("two plus scale", lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * (2 + s) + b),
    ("one minus scale", lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * (1 - s) + b),
    ("scale without one", lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * s + b),
    ("rms norm", lambda x, s, b: F.rms_norm(x, x.shape[-1:]) * (1 + s) + b),
    ("no norm", lambda x, s, b: x * (1 + s) + b),
    ("norm over two dims", lambda x, s, b: F.layer_norm(x, x.shape[-2:]) * (1 + s) + b),
])
def test_near_misses_are_not_layernorm_modulate(name, fn):
    args = (torch.randn(2, 5, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["modulate"])
    assert count_op(gm, OP) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_shift_subtracted_or_scaled_add_keeps_the_add():
    # `- shift` and `add(..., alpha=2)` are not `+ shift`: only the scale part may fuse
    for fn in (lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * (1 + s) - b,
               lambda x, s, b: torch.add(F.layer_norm(x, x.shape[-1:]) * (1 + s), b, alpha=2)):
        args = (torch.randn(2, 5, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8))
        run, gm, result = rewrite(fn, args)
        assert result.counts["modulate"] == 1
        assert any(t in targets(gm) for t in (aten.sub.Tensor, aten.add.Tensor))
        assert bits_equal(run(*args), fn(*args))


def test_scale_broadcasting_beyond_the_input_is_skipped():
    fn = lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * (1 + s) + b  # noqa: E731
    args = (torch.randn(1, 5, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 8))  # output is [3, 5, 8]
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 0
    assert any("broadcast" in s.reason for s in result.skipped)
    assert bits_equal(run(*args), fn(*args))


def test_scale_broadcast_over_another_dim_is_computed_as_written():
    # x is [B, D, D]: a scale broadcast over the wrong dim still broadcasts. The op receives the
    # operand exactly as the chain used it, so the result is the chain's, bit for bit.
    fn = lambda x, s, b: F.layer_norm(x, x.shape[-1:]) * (1 + s[:, :, None]) + b[:, None]  # noqa: E731
    args = (torch.randn(2, 8, 8), torch.randn(2, 8), torch.randn(2, 8))
    run, gm, _ = rewrite(fn, args)
    assert bits_equal(run(*args), fn(*args))


def test_symbolic_shapes():
    fn = make_chain("unsqueeze")
    args = make_args("unsqueeze", B=2, S=7, D=12)
    run, gm, result = rewrite(fn, args, dynamic=True)
    assert result.counts["modulate"] == 1
    for shape in [(2, 7, 12), (3, 4, 12)]:
        a = make_args("unsqueeze", *shape)
        assert bits_equal(run(*a), fn(*a))


def test_passes_need_fake_tensor_metadata():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="fake-tensor metadata"):
        PassManager().apply(gm)


def test_opcheck():
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 5, 16, dtype=dtype)
        s, b = torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 1, 16, dtype=dtype)
        w, bias = torch.randn(16, dtype=dtype), torch.randn(16, dtype=dtype)
        for args in [(x, None, None, 1e-6, s, b, True), (x, w, bias, 1e-5, s, None, True),
                     (x, None, None, 1e-6, s, b, False)]:
            torch.library.opcheck(layernorm_modulate, args)


def test_reference_is_the_eager_chain():
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference as ref

    x, s, b = torch.randn(3, 7, 24, dtype=torch.bfloat16), torch.randn(3, 1, 24, dtype=torch.bfloat16), \
        torch.randn(3, 1, 24, dtype=torch.bfloat16)
    want = F.layer_norm(x, (24,), eps=1e-6) * (1 + s) + b
    assert bits_equal(ref(x, None, None, 1e-6, s, b, True), want)


# --- RMSNorm-modulate and bare modulation ---------------------------------------------------

NORM_OPS = {"F.rms_norm": registry.op_def("rmsnorm_modulate").load(),
            "diffusers": registry.op_def("rmsnorm_modulate").load(),
            "none": registry.op_def("modulate").load()}
RMS_CHAIN = (aten.pow.Tensor_Scalar, aten.mean.dim, aten.rsqrt.default)


@given(
    norm=st.sampled_from(list(NORM_OPS)), form=st.sampled_from(FORMS),
    shift=st.booleans(), swap_mul=st.booleans(), swap_add=st.booleans(),
    affine=st.booleans(), upcast=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    B=st.integers(1, 3), S=st.integers(1, 9), D=st.sampled_from([4, 8, 12, 32, 36]),
    eps=st.sampled_from([1e-6, 1e-5]),
)
def test_every_rms_and_bare_spelling_is_one_bitexact_site(norm, form, shift, swap_mul, swap_add, affine, upcast,
                                                          dtype, B, S, D, eps):
    fn = make_chain(form, shift, swap_mul, swap_add, affine, upcast, eps, norm=norm)
    args = make_args(form, B, S, D, dtype)
    run, gm, result = rewrite(fn, args, families=["modulate"])
    assert result.counts["modulate"] == 1, result.skipped
    assert count_op(gm, NORM_OPS[norm]) == 1
    assert not set(RMS_CHAIN) & set(targets(gm)) and aten.mul.Tensor not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == NORM_OPS[norm])
    if norm != "none":  # an affine norm keeps its weight, an affine-free one has none
        assert (node.args[1] is not None) == affine
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shift", [True, False])
def test_fused_rms_norm_modulate(dtype, shift):
    # F.rms_norm as CUDA graphs hold it: one aten._fused_rms_norm node
    def fn(x, w, s, b):
        n = aten._fused_rms_norm.default(x, [16], w, 1e-6)[0]
        y = aten.mul.Tensor(n, aten.add.Tensor(s, 1))
        return aten.add.Tensor(y, b) if shift else y

    args = (torch.randn(2, 5, 16).to(dtype), torch.randn(16).to(dtype), torch.randn(2, 1, 16).to(dtype),
            torch.randn(2, 1, 16).to(dtype))
    gm = capture.fx_graph(fn, *args)
    result = PassManager(families=["modulate"]).apply(gm)
    assert result.counts["modulate"] == 1
    node = next(n for n in gm.graph.nodes if n.target == NORM_OPS["F.rms_norm"])
    assert node.args[3] == "fused" and aten._fused_rms_norm.default not in targets(gm)
    assert bits_equal(gm(*args), fn(*args))


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-3])
def test_rms_eps_and_form_are_carried_exactly(eps):
    for norm, form in (("diffusers", "diffusers"), ("F.rms_norm", "composite")):
        fn = make_chain("unsqueeze", eps=eps, affine=True, norm=norm)
        args = make_args("unsqueeze", dtype=torch.bfloat16)
        run, gm, _ = rewrite(fn, args)
        node = next(n for n in gm.graph.nodes if n.target == NORM_OPS[norm])
        assert node.args[3] == form
        assert node.args[2] == (eps if form == "diffusers" else torch.tensor(eps, dtype=torch.float32).item())
        assert bits_equal(run(*args), fn(*args))


def test_one_rms_norm_feeding_two_modulates_is_two_sites():
    def fn(x, e1, e2):
        n = F.rms_norm(x, x.shape[-1:], eps=1e-6)
        return n * (1 + e1[:, None]) + e2[:, None], n * (1 + e2[:, None]) + e1[:, None]

    args = (torch.randn(2, 5, 8, dtype=torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16),
            torch.randn(2, 8, dtype=torch.bfloat16))
    run, gm, result = rewrite(fn, args)
    assert result.counts["modulate"] == 2 and count_op(gm, NORM_OPS["F.rms_norm"]) == 2
    assert not set(RMS_CHAIN) & set(targets(gm))
    assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


@pytest.mark.parametrize("name,fn", [
    ("rms over two dims", lambda x, s, b: F.rms_norm(x, x.shape[-2:]) * (1 + s) + b),
    ("rms in bf16, no upcast", lambda x, s, b: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + s) + b),
    ("rms of another tensor", lambda x, s, b: (x + 1) * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
     * (1 + s) + b),
])
def test_near_misses_are_not_rmsnorm_modulate(name, fn):
    # the modulation alone may still be fused (a bare `modulate`): never into an RMSNorm op
    args = (torch.randn(2, 5, 8, dtype=torch.bfloat16), torch.randn(2, 1, 8, dtype=torch.bfloat16),
            torch.randn(2, 1, 8, dtype=torch.bfloat16))
    run, gm, result = rewrite(fn, args, families=["modulate"])
    assert count_op(gm, NORM_OPS["F.rms_norm"]) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_a_norm_that_fails_its_guard_still_lets_the_modulation_fuse():
    fn = lambda x, s, b: F.layer_norm(x, x.shape[-2:]) * (1 + s) + b  # noqa: E731
    args = (torch.randn(2, 5, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["modulate"])
    assert count_op(gm, NORM_OPS["none"]) == 1 and count_op(gm, OP) == 0
    assert aten.native_layer_norm.default in targets(gm)
    assert bits_equal(run(*args), fn(*args))


def test_opcheck_rms_and_bare():
    from sgdiff.kernels.modulate import modulate
    from sgdiff.kernels.rmsnorm_modulate import rmsnorm_modulate

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 5, 16, dtype=dtype)
        s, b = torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
        w = torch.randn(16, dtype=dtype)
        for form in ("composite", "fused", "diffusers"):
            torch.library.opcheck(rmsnorm_modulate, (x, w, 1e-6, form, s, b))
            torch.library.opcheck(rmsnorm_modulate, (x, None, 1e-5, form, s, None))
        torch.library.opcheck(modulate, (x, s, b))
        torch.library.opcheck(modulate, (x, s, None))
