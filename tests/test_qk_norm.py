"""Family `qk_norm`: RMSNorm (every eager form) and LayerNorm on queries and keys."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from sgdiff.fxpasses import PassManager
from sgdiff.kernels import registry
from tests.capture import diffusers_rms_norm, fx_graph, rewrite
from tests.helpers import bits_equal, count_op, targets

aten = torch.ops.aten
RMS = registry.op_def("rms_norm").load()
LN = registry.op_def("layer_norm").load()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NORMS = ["F.rms_norm", "diffusers", "diffusers_no_affine", "layer_norm", "layer_norm_no_affine"]
LAYOUTS = ["bshd", "bhsd", "across_heads"]  # Flux/QwenImage, SD3 (transposed), Wan (before unflatten)
CHAIN_OPS = (aten.pow.Tensor_Scalar, aten.rsqrt.default, aten.mean.dim, aten.native_layer_norm.default)


def norm_fn(kind, eps):
    def norm(t, w, b):
        if kind == "F.rms_norm":
            return F.rms_norm(t, t.shape[-1:], w, eps)
        if kind.startswith("diffusers"):
            return diffusers_rms_norm(t, None if kind.endswith("no_affine") else w, eps)
        affine = not kind.endswith("no_affine")
        return F.layer_norm(t, t.shape[-1:], w if affine else None, b if affine else None, eps)

    return norm


def make_qk(kind, layout, heads, eps=1e-6):
    """Normalized q and k of an attention processor, spelled as ``layout`` says."""
    norm = norm_fn(kind, eps)

    def split(t):
        B, S, _ = t.shape
        if layout == "bhsd":  # SD3: view(B, -1, heads, head_dim).transpose(1, 2), then the norm
            return t.view(B, -1, heads, t.shape[-1] // heads).transpose(1, 2)
        return t.unflatten(-1, (heads, -1))

    def fn(q, k, w, b):
        if layout == "across_heads":  # Wan: norm over all heads, then unflatten
            return split(norm(q, w, b)), split(norm(k, w, b))
        return norm(split(q), w, b), norm(split(k), w, b)

    return fn


def make_args(layout, B=2, S=5, H=3, D=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, S, H * D, generator=g).to(dtype) for _ in range(2))
    n = H * D if layout == "across_heads" else D
    w, b = torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
    return q, k, w, b


@given(
    kind=st.sampled_from(NORMS), layout=st.sampled_from(LAYOUTS), dtype=st.sampled_from(DTYPES),
    B=st.integers(1, 3), S=st.integers(1, 7), H=st.integers(2, 4), D=st.sampled_from([2, 4, 8, 12, 16]),
    eps=st.sampled_from([1e-6, 1e-5, 1e-3]),
)
def test_every_spelling_is_two_bitexact_sites(kind, layout, dtype, B, S, H, D, eps):
    fn = make_qk(kind, layout, H, eps)
    args = make_args(layout, B, S, H, D, dtype)
    run, gm, result = rewrite(fn, args, families=["qk_norm"])
    op = LN if kind.startswith("layer_norm") else RMS
    assert result.counts["qk_norm"] == 2, result.skipped
    assert count_op(gm, op) == 2
    assert not set(CHAIN_OPS) & set(targets(gm))
    for got, want in zip(run(*args), fn(*args)):
        assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_fused_rms_norm_form(dtype, weighted):
    # the CUDA form of F.rms_norm: one aten._fused_rms_norm node (eps None: the dtype's epsilon)
    def fn(q, k, w):
        wq = w if weighted else None
        q, k = aten.view.default(q, [2, 5, 3, 8]), aten.view.default(k, [2, 5, 3, 8])  # unflatten heads
        return (aten._fused_rms_norm.default(q, [8], wq, 1e-6)[0],
                aten._fused_rms_norm.default(k, [8], wq, None)[0])

    args = (torch.randn(2, 5, 24).to(dtype), torch.randn(2, 5, 24).to(dtype), torch.randn(8).to(dtype))
    gm = fx_graph(fn, *args)
    result = PassManager(families=["qk_norm"]).apply(gm)
    assert result.counts["qk_norm"] == 2
    assert aten._fused_rms_norm.default not in targets(gm)
    forms = [n.args[3] for n in gm.graph.nodes if n.target == RMS]
    assert forms == ["fused", "fused"]
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want)


@pytest.mark.parametrize("kind,form", [("F.rms_norm", "composite"), ("diffusers", "diffusers")])
def test_rms_form_and_eps_are_carried(kind, form):
    for eps in (1e-6, 1e-5, 0.25):
        fn = make_qk(kind, "bshd", 2, eps)
        args = make_args("bshd", H=2, dtype=torch.bfloat16)
        run, gm, _ = rewrite(fn, args, families=["qk_norm"])
        node = next(n for n in gm.graph.nodes if n.target == RMS)
        assert node.args[3] == form
        # F.rms_norm's composite adds eps rounded to fp32 (as it appears in the graph)
        assert node.args[2] == (torch.tensor(eps, dtype=torch.float32).item() if form == "composite" else eps)
        assert node.args[1] is not None  # an affine norm keeps its weight
        assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


def test_fp32_norm_of_half_precision_heads():
    # AuraFlow's fp32 LayerNorm QK-norm: the heads are cast up, normalized, and cast back
    def fn(q, k, w, b):
        return tuple(F.layer_norm(t.unflatten(-1, (2, -1)).float(), (8,), w.float(), b.float(), 1e-5).to(t.dtype)
                     for t in (q, k))

    args = make_args("bshd", H=2, dtype=torch.bfloat16)
    run, gm, result = rewrite(fn, args, families=["qk_norm"])
    assert result.counts["qk_norm"] == 2 and count_op(gm, LN) == 2
    assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


def test_affine_free_norm_carries_no_weight():
    for kind in ("diffusers_no_affine", "layer_norm_no_affine"):
        _, gm, _ = rewrite(make_qk(kind, "bshd", 2), make_args("bshd", H=2), families=["qk_norm"])
        node = next(n for n in gm.graph.nodes if n.target in (RMS, LN))
        assert node.args[1] is None


@pytest.mark.parametrize("name,fn", [
    # QwenImage's txt_norm: an RMSNorm over the model width, feeding a linear
    ("a norm over the model width",
     lambda x, w: F.linear(diffusers_rms_norm(x, w[:16], 1e-6), w[:8, None].expand(8, 16))),
    # a rank-4 tensor that is no projection split into heads (a video's [B, F, S, D] tokens)
    ("a norm over video tokens", lambda x, w: F.rms_norm(x.view(2, 1, 5, 16), (16,), w[:16], 1e-6)),
    # heads split, then the head dim moved away from the last place
    ("a norm across the heads of one head dim", lambda x, w: F.rms_norm(x.unflatten(-1, (2, 8)).transpose(-1, -2),
                                                                       (2,), w[:2], 1e-6)),
])
def test_a_norm_outside_attention_is_not_a_qk_norm_but_a_norm(name, fn):
    """Not a QK-norm site; the norm family (sgdiff/patterns/norm.py) takes it on its own."""
    args = (torch.randn(2, 5, 16), torch.randn(16))
    run, gm, result = rewrite(fn, args)
    assert result.passes["qk_norm"].found_count == 0, name
    assert result.counts["norm"] == count_op(gm, RMS) == 1, name
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("name,fn", [
    ("over two dims", lambda t, w: F.rms_norm(t, t.shape[-2:], None, 1e-6)),
    ("cube, not square", lambda t, w: t * torch.rsqrt(t.pow(3).mean(-1, keepdim=True) + 1e-6)),
    ("mean without keepdim", lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1) + 1e-6)[..., None]),
    ("another tensor normalized", lambda t, w: (t + 1) * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)),
    ("eps subtracted", lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) - 1e-6)),
])
def test_near_misses_are_not_rms_norm(name, fn):
    def qk(q, w):
        return fn(q.unflatten(-1, (2, -1)), w)

    args = (torch.randn(2, 5, 16), torch.randn(8))
    run, gm, result = rewrite(qk, args, families=["qk_norm"])
    assert count_op(gm, RMS) == 0, name
    assert bits_equal(run(*args), qk(*args))


def test_rms_norm_in_half_precision_without_upcast_is_skipped():
    # a hand-written RMSNorm reducing in bf16: no known form rounds like that
    def fn(q):
        t = q.unflatten(-1, (2, -1))
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    args = (torch.randn(2, 5, 16, dtype=torch.bfloat16),)
    run, gm, result = rewrite(fn, args, families=["qk_norm"])
    assert result.counts["qk_norm"] == 0
    assert any("rounding steps" in s.reason for s in result.skipped)
    assert bits_equal(run(*args), fn(*args))


def test_fp32_weight_on_bf16_input_keeps_diffusers_promotion():
    # diffusers RMSNorm with an fp32 weight on bf16 activations returns fp32: still the op
    def fn(q, w):
        return diffusers_rms_norm(q.unflatten(-1, (2, -1)), w, 1e-6)

    args = (torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(8))
    run, gm, result = rewrite(fn, args, families=["qk_norm"])
    assert result.counts["qk_norm"] == 1
    assert run(*args).dtype == torch.float32 and bits_equal(run(*args), fn(*args))


def test_intermediate_with_another_user_is_skipped():
    def fn(q):
        t = q.unflatten(-1, (2, -1))
        r = torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
        return t * r, r

    args = (torch.randn(2, 5, 16),)
    run, gm, result = rewrite(fn, args, families=["qk_norm"])
    assert result.counts["qk_norm"] == 0
    assert any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


def test_symbolic_shapes():
    fn = make_qk("F.rms_norm", "bshd", 2)
    run, gm, result = rewrite(fn, make_args("bshd", S=5, H=2), families=["qk_norm"], dynamic=True)
    assert result.counts["qk_norm"] == 2
    for S in (3, 9):
        args = make_args("bshd", S=S, H=2)
        assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    from sgdiff.kernels.layer_norm import layer_norm
    from sgdiff.kernels.rms_norm import rms_norm

    x = torch.randn(2, 5, 3, 8, dtype=dtype)
    w, b = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    for form in ("composite", "fused", "diffusers"):
        for args in [(x, w, 1e-6, form), (x.transpose(1, 2), None, 1e-5, form)]:
            torch.library.opcheck(rms_norm, args)
            out = rms_norm(*args)
            assert out.stride() == torch.empty_like(args[0]).stride()
    for args in [(x, w, b, 1e-6), (x.transpose(1, 2), None, None, 1e-5)]:
        torch.library.opcheck(layer_norm, args)
        assert layer_norm(*args).is_contiguous()


RMS_ROPE = registry.op_def("rms_norm_rope").load()


def aten_rope(n, shape, cos, sin, interleaved, dtype):
    """diffusers' apply_rotary_emb (use_real, sequence_dim=1) on ``n`` of ``shape``, in the ATen
    calls a capture gives."""
    B, S, H, D = shape
    if interleaved:
        u = aten.unbind.int(aten.view.default(n, [B, S, H, D // 2, 2]), -1)
        rot = aten.view.default(aten.stack.default([aten.neg.default(u[1]), u[0]], -1), [B, S, H, D])
    else:
        u = aten.unbind.int(aten.view.default(n, [B, S, H, 2, D // 2]), -2)
        rot = aten.cat.default([aten.neg.default(u[1]), u[0]], -1)
    half = dtype != torch.float32
    up = (lambda t: aten._to_copy.default(t, dtype=torch.float32)) if half else (lambda t: t)
    out = aten.add.Tensor(aten.mul.Tensor(up(n), cos), aten.mul.Tensor(up(rot), sin))
    return aten._to_copy.default(out, dtype=dtype) if half else out


def fused_norm(t, shape, w):
    return aten._fused_rms_norm.default(aten.view.default(t, shape), [shape[-1]], w, 1e-6)[0]


def tables(cos, sin):  # cos[None, :, None], as apply_rotary_emb indexes them
    return tuple(aten.unsqueeze.default(aten.unsqueeze.default(t, 0), 2) for t in (cos, sin))


def cuda_form_single_block(D, interleaved, weighted=True, extra_user=False, dtype=torch.bfloat16, S=5, H=2):
    """Flux single block as a CUDA capture gives it: F.rms_norm is aten._fused_rms_norm over
    head_dim; then the RoPE, on q and k."""

    def fn(q, k, w, cos, sin):
        cos, sin = tables(cos, sin)
        outs = []
        for t in (q, k):
            n = fused_norm(t, [2, S, H, D], w if weighted else None)
            outs.append(aten_rope(n, (2, S, H, D), cos, sin, interleaved, dtype))
            if extra_user:
                outs.append(n)
        return tuple(outs)

    return fn


def cuda_form_double_block(interleaved, weighted=True, dtype=torch.bfloat16, St=3, Si=5, H=2, D=128, eps1=1e-6):
    """Flux double block as a CUDA capture gives it: text and image q (and k) normalized apart,
    joined along the sequence (text first), then rotated."""

    def fn(qt, qi, kt, ki, wt, wi, cos, sin):
        cos, sin = tables(cos, sin)
        outs = []
        for t, i in ((qt, qi), (kt, ki)):
            nt = fused_norm(t, [2, St, H, D], wt if weighted else None)
            ni = aten._fused_rms_norm.default(aten.view.default(i, [2, Si, H, D]), [D], wi if weighted else None,
                                              eps1)[0]
            y = aten.cat.default([nt, ni], 1)
            outs.append(aten_rope(y, (2, St + Si, H, D), cos, sin, interleaved, dtype))
        return tuple(outs)

    return fn


def double_block_args(dtype, St=3, Si=5, H=2, D=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(2, S, H * D, generator=g).to(dtype) for S in (St, Si, St, Si)]
    return (*t, torch.randn(D, generator=g).to(dtype), torch.randn(D, generator=g).to(dtype),
            torch.randn(St + Si, D, generator=g), torch.randn(St + Si, D, generator=g))


def single_block_args(D, dtype, S=5, H=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, S, H * D, generator=g).to(dtype), torch.randn(2, S, H * D, generator=g).to(dtype),
            torch.randn(D, generator=g).to(dtype), torch.randn(S, D, generator=g), torch.randn(S, D, generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_fused_rms_norm_then_rope_is_one_op(dtype, interleaved, weighted):
    fn, args = cuda_form_single_block(128, interleaved, weighted, dtype=dtype), single_block_args(128, dtype)
    gm = fx_graph(fn, *args)
    result = PassManager(families=["rope", "qk_norm"]).apply(gm)
    assert result.counts == {"rope": 2, "qk_norm": 2} and result.passes["qk_norm"].ops == {"rms_norm_rope": 2}
    assert count_op(gm, RMS_ROPE) == 2 and count_op(gm, RMS) == 0
    assert aten._fused_rms_norm.default not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == RMS_ROPE)
    assert node.args[3] == "fused" and node.args[6] is interleaved and (node.args[1] is not None) == weighted
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,fn,D", [
    ("head_dim 64", cuda_form_single_block(64, True), 64),
    ("the norm output read again", cuda_form_single_block(128, True, extra_user=True), 128),
])
def test_rms_norm_and_rope_stay_apart(name, fn, D):
    args = single_block_args(D, torch.bfloat16)
    gm = fx_graph(fn, *args)
    result = PassManager(families=["rope", "qk_norm"]).apply(gm)
    assert count_op(gm, RMS_ROPE) == 0, name
    assert result.counts == {"rope": 2, "qk_norm": 2} and not result.skipped  # not sites: no skip reported
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want)


def test_composite_rms_norm_stays_apart():
    # on CPU F.rms_norm is a composite: the rms_norm op and the rope op, each bit-exact
    from diffusers.models.embeddings import apply_rotary_emb

    def fn(q, cos, sin):
        n = F.rms_norm(q.unflatten(-1, (2, 128)), (128,), None, 1e-6)
        return apply_rotary_emb(n, (cos, sin), use_real_unbind_dim=-1, sequence_dim=1)

    args = (torch.randn(2, 5, 256, dtype=torch.bfloat16), torch.randn(5, 128), torch.randn(5, 128))
    run, gm, result = rewrite(fn, args, families=["rope", "qk_norm"])
    assert count_op(gm, RMS_ROPE) == 0 and count_op(gm, RMS) == 1
    assert bits_equal(run(*args), fn(*args))


RMS_CAT_ROPE = registry.op_def("rms_norm_cat_rope").load()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_two_fused_rms_norms_joined_then_rope_is_one_op(dtype, interleaved, weighted):
    fn, args = cuda_form_double_block(interleaved, weighted, dtype), double_block_args(dtype)
    gm = fx_graph(fn, *args)
    result = PassManager(families=["rope", "qk_norm"]).apply(gm)
    # four QK norms, as four sites, in two ops
    assert result.counts == {"rope": 2, "qk_norm": 4} and result.passes["qk_norm"].ops == {"rms_norm_cat_rope": 4}
    assert count_op(gm, RMS_CAT_ROPE) == 2 and count_op(gm, RMS) == 0 and aten.cat.default not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == RMS_CAT_ROPE)
    assert node.args[0].args[1] == [2, 3, 2, 128] and node.args[2].args[1] == [2, 5, 2, 128]  # text first
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want) and got.stride() == want.stride()


def test_two_norms_with_different_eps_stay_apart():
    fn, args = cuda_form_double_block(True, eps1=1e-5), double_block_args(torch.bfloat16)
    gm = fx_graph(fn, *args)
    result = PassManager(families=["rope", "qk_norm"]).apply(gm)
    assert count_op(gm, RMS_CAT_ROPE) == 0 and count_op(gm, RMS) == 4
    assert {s.reason for s in result.skipped} == {"the two norms have different eps"}
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want)


def _norm_rope_split(split: bool):
    """LTX-Video's attention: an RMSNorm across the heads, the rotary embedding over the whole
    width, then (``split``) the head split; without it the rotated norm is read whole."""
    from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

    def attention_inputs(q, w, cos, sin):
        r = apply_rotary_emb(F.rms_norm(q, (q.shape[-1],), w, 1e-6), (cos, sin))
        return r.unflatten(2, (2, -1)) if split else r * 2

    return attention_inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_across_heads_norm_before_rope_then_the_head_split_is_a_site(dtype):
    args = (torch.randn(1, 6, 16).to(dtype), torch.randn(16).to(dtype), torch.randn(1, 6, 16), torch.randn(1, 6, 16))
    for split, sites in ((True, 1), (False, 0)):  # without the head split: not a QK norm
        fn = _norm_rope_split(split)
        run, gm, result = rewrite(fn, args, families=["rope", "qk_norm"])
        assert result.counts["rope"] == 1 and result.counts["qk_norm"] == sites, split
        assert result.passes["qk_norm"].found_count == sites and count_op(gm, RMS) == sites
        assert bits_equal(run(*args), fn(*args))


RMS_HEADS_ROPE = registry.op_def("rms_norm_heads_rope").load()
ROPE_OPS = {"even_odd": registry.op_def("rope_even_odd").load(), "interleaved": registry.op_def("rope").load(),
            "halves": registry.op_def("rope").load()}


def cuda_form_across_heads(rotation, weighted=True, extra_user=False, shape=None, weight_dtype=None):
    """Wan's QK norms as a CUDA capture gives them once the rope family has run: aten._fused_rms_norm
    over the whole projection, its split into heads, then the RoPE op over the heads."""

    B, S, N = 2, 5, 256  # across_heads_args's

    def fn(q, k, w, cos, sin):
        outs = []
        for t in (q, k):
            n = aten._fused_rms_norm.default(t, shape or [N], (w.to(weight_dtype) if weight_dtype else w)
                                             if weighted else None, 1e-6)[0]
            heads = aten.view.default(n, [B, S, 2, N // 2])
            rope = ROPE_OPS[rotation]
            outs.append(rope(heads, cos, sin) if rotation == "even_odd" else rope(heads, cos, sin,
                                                                                    rotation == "interleaved"))
            if extra_user:
                outs.append(heads)
        return tuple(outs)

    return fn


def across_heads_args(rotation, dtype, S=5, D=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = D // 2 if rotation == "even_odd" else D
    return (torch.randn(2, S, 2 * D, generator=g).to(dtype), torch.randn(2, S, 2 * D, generator=g).to(dtype),
            torch.randn(2 * D, generator=g).to(dtype), torch.randn(1, S, 1, width, generator=g),
            torch.randn(1, S, 1, width, generator=g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotation", ["even_odd", "interleaved", "halves"])
@pytest.mark.parametrize("weighted", [True, False])
def test_fused_rms_norm_over_heads_split_then_rope_is_one_op(dtype, rotation, weighted):
    """Wan: the norm over every head, its split into heads and the RoPE become one op per q and k;
    the norm stays a qk_norm site each."""
    fn, args = cuda_form_across_heads(rotation, weighted), across_heads_args(rotation, dtype)
    gm = fx_graph(fn, *args)
    result = PassManager(families=["rope", "qk_norm"]).apply(gm)
    assert {f: n for f, n in result.counts.items() if n} == {"qk_norm": 2}  # the RoPE ops came made
    assert result.passes["qk_norm"].ops == {"rms_norm_heads_rope": 2}
    assert count_op(gm, RMS_HEADS_ROPE) == 2 and count_op(gm, ROPE_OPS[rotation]) == 0
    assert aten._fused_rms_norm.default not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == RMS_HEADS_ROPE)
    assert node.args[3] == "fused" and node.args[4] == 2 and node.args[7] == rotation
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("case", ["the heads read again", "a norm over two dims", "an fp32 weight"])
def test_rms_norm_over_heads_and_rope_stay_apart(case):
    kwargs = {"the heads read again": dict(extra_user=True), "a norm over two dims": dict(shape=[5, 256]),
              "an fp32 weight": dict(weight_dtype=torch.float32)}[case]
    fn, args = cuda_form_across_heads("even_odd", **kwargs), across_heads_args("even_odd", torch.bfloat16)
    gm = fx_graph(fn, *args)
    PassManager(families=["rope", "qk_norm"]).apply(gm)
    assert count_op(gm, RMS_HEADS_ROPE) == 0, case
    assert count_op(gm, ROPE_OPS["even_odd"]) == 2
    for got, want in zip(gm(*args), fn(*args)):
        assert bits_equal(got, want)
