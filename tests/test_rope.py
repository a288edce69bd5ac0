"""Family `rope`: rotary embeddings, interleaved, rotate-half, complex and Wan's even/odd writes."""
import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen
from hypothesis import given, strategies as st

from sgdiff.kernels import registry
from tests.capture import rewrite
from tests.helpers import bits_equal, count_op, targets

aten = torch.ops.aten
OPS = {form: registry.op_def(name).load() for form, name in
       [("interleaved", "rope"), ("rotate_half", "rope"), ("complex", "rope_complex"), ("even_odd", "rope_even_odd")]}
FORMS = list(OPS)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def wan_rope(x, freqs_cos, freqs_sin):
    """diffusers WanAttnProcessor's nested apply_rotary_emb, verbatim."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def apply(form, x, tables, sequence_dim):
    if form == "complex":
        if sequence_dim == 1:  # QwenImage: freqs [S, D/2] -> unsqueeze(1)
            return apply_rotary_emb_qwen(x, tables[0], use_real=False)
        return apply_rotary_emb(x, tables[0], use_real=False)  # Lumina: [B, S, D/2] -> unsqueeze(2)
    if form == "even_odd":
        return wan_rope(x, *tables)
    return apply_rotary_emb(x, tables, use_real_unbind_dim=-1 if form == "interleaved" else -2,
                            sequence_dim=sequence_dim)


def make_rope(form, sequence_dim, transposed):
    def fn(q, k, *tables):
        if transposed:  # heads-first tensors made by a transpose, as SD3-style processors do
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        return apply(form, q, tables, sequence_dim), apply(form, k, tables, sequence_dim)

    return fn


def make_args(form, sequence_dim, transposed, B=2, S=5, H=3, D=8, dtype=torch.float32,
              table_dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    heads_first = sequence_dim == 2 and form in ("interleaved", "rotate_half")  # [B, H, S, D]
    shape = (B, H, S, D) if heads_first else (B, S, H, D)
    if transposed:  # made contiguous the other way round; fn transposes it back
        shape = (shape[0], shape[2], shape[1], shape[3])
    q, k = (torch.randn(*shape, generator=g).to(dtype) for _ in range(2))
    if form == "complex":  # QwenImage: [S, D/2]; Lumina: per-batch [B, S, D/2]
        table_shape = (S, D // 2) if sequence_dim == 1 else (B, S, D // 2)
        tables = (torch.polar(torch.ones(table_shape), torch.randn(table_shape, generator=g)),)
    elif form == "even_odd":
        tables = tuple(torch.randn(1, S, 1, D, generator=g).to(table_dtype) for _ in range(2))
    else:
        tables = tuple(torch.randn(S, D, generator=g) for _ in range(2))
    return (q, k) + tables


@given(
    form=st.sampled_from(FORMS), sequence_dim=st.sampled_from([1, 2]), transposed=st.booleans(),
    dtype=st.sampled_from(DTYPES), table_dtype=st.sampled_from([torch.float32, "model"]),
    B=st.integers(1, 3), S=st.integers(1, 7), H=st.integers(1, 4), D=st.sampled_from([2, 4, 8, 12, 32]),
)
def test_every_spelling_is_two_bitexact_sites(form, sequence_dim, transposed, dtype, table_dtype, B, S, H, D):
    if form == "even_odd":
        sequence_dim = 1  # Wan's tables are [1, S, 1, D]
    fn = make_rope(form, sequence_dim, transposed)
    args = make_args(form, sequence_dim, transposed, B, S, H, D, dtype,
                     dtype if table_dtype == "model" else table_dtype)
    run, gm, result = rewrite(fn, args, families=["rope"])
    want = fn(*args)
    layout_ok = all(w.stride() == torch.empty_like(w).stride() for w in want)
    if layout_ok:
        assert result.counts["rope"] == 2, result.skipped
        assert count_op(gm, OPS[form]) == 2
        assert not {aten.unbind.int, aten.view_as_complex.default, aten.slice_scatter.default} & set(targets(gm))
    else:  # the chain itself left another layout: the site is kept, with its reason
        assert all("layout" in s.reason for s in result.skipped)
    for got, w in zip(run(*args), want):
        assert bits_equal(got, w) and got.stride() == w.stride()


def test_interleaved_and_rotate_half_are_told_apart():
    for form in ("interleaved", "rotate_half"):
        fn = make_rope(form, 1, False)
        args = make_args(form, 1, False)
        run, gm, _ = rewrite(fn, args, families=["rope"])
        flags = [n.args[3] for n in gm.graph.nodes if n.target == OPS[form]]
        assert flags == [form == "interleaved"] * 2
        assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


def _real_rope(join, upcast=True, cast_back=True):
    """``(x.float() * cos + x_rot.float() * sin).to(x.dtype)`` with ``x_rot = join(real, imag)``."""
    def fn(x, cos, sin):
        real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rot, cos, sin = join(real, imag), cos[None, :, None], sin[None, :, None]
        if not upcast:
            return x * cos.to(x.dtype) + x_rot * sin.to(x.dtype)
        out = x.float() * cos + x_rot.float() * sin
        return out.to(x.dtype) if cast_back else out

    return fn


def _interleave(a, b):
    return torch.stack([a, b], -1).flatten(3)


@pytest.mark.parametrize("name,fn", [
    ("the reference spelling", _real_rope(lambda re, im: _interleave(-im, re))),
    ("rotation with the sign on the other half", _real_rope(lambda re, im: _interleave(im, -re))),
    ("pairs not rotated", _real_rope(lambda re, im: _interleave(re, -im))),
    ("interleaved pairs joined as halves", _real_rope(lambda re, im: torch.cat([-im, re], -1))),
])
def test_near_misses_are_not_rope(name, fn):
    args = (torch.randn(2, 5, 3, 8, dtype=torch.bfloat16), torch.randn(5, 8), torch.randn(5, 8))
    run, gm, result = rewrite(fn, args, families=["rope"])
    assert count_op(gm, OPS["interleaved"]) == (1 if name == "the reference spelling" else 0), name
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("name,fn,arith", [
    ("not cast back: the result left in fp32", _real_rope(lambda re, im: _interleave(-im, re), cast_back=False),
     torch.float32),
    ("bf16 tables, no upcast: bf16 products and sum", _real_rope(lambda re, im: _interleave(-im, re), upcast=False),
     torch.bfloat16),
])
def test_a_rope_computed_in_one_dtype_is_a_site(name, fn, arith):
    """Written without the usual casts, the chain computes every op in one dtype: the op takes
    that dtype (``arith_dtype``) and gives eager's bits in it."""
    args = (torch.randn(2, 5, 3, 8, dtype=torch.bfloat16), torch.randn(5, 8), torch.randn(5, 8))
    run, gm, result = rewrite(fn, args, families=["rope"])
    node, = [n for n in gm.graph.nodes if n.target == OPS["interleaved"]]
    assert node.args[4] == arith, name
    got, want = run(*args), fn(*args)
    assert got.dtype == want.dtype == arith and bits_equal(got, want)


def test_a_rope_of_mixed_tables_is_not_a_site():
    """x * cos + x_rot * sin with a bf16 cos and an fp32 sin: the two products round to other
    dtypes, which no single arith_dtype gives."""
    x, cos, sin = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16), torch.randn(5, 8), torch.randn(5, 8)

    def mixed(x, cos, sin):
        real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        return x * cos[None, :, None].to(x.dtype) + _interleave(-imag, real) * sin[None, :, None]

    run, gm, result = rewrite(mixed, (x, cos, sin), families=["rope"])
    assert count_op(gm, OPS["interleaved"]) == 0 and bits_equal(run(x, cos, sin), mixed(x, cos, sin))


def test_rotation_of_another_tensor_is_not_rope():
    def fn(x, y, cos, sin):
        real, imag = y.reshape(*y.shape[:-1], -1, 2).unbind(-1)
        x_rot = _interleave(-imag, real)
        return (x.float() * cos[None, :, None] + x_rot.float() * sin[None, :, None]).to(x.dtype)

    args = (torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8), torch.randn(5, 8), torch.randn(5, 8))
    run, gm, result = rewrite(fn, args, families=["rope"])
    assert result.passes["rope"].found_count == 0
    assert bits_equal(run(*args), fn(*args))


def test_tables_broadcasting_beyond_x_are_skipped():
    # a batch of two tables applied to a batch of one: the output outgrows x
    def outgrowing(x, cos, sin):
        real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        return (x.float() * cos + _interleave(-imag, real).float() * sin).to(x.dtype)

    args = (torch.randn(1, 5, 3, 8), torch.randn(2, 5, 1, 8), torch.randn(2, 5, 1, 8))
    run, gm, result = rewrite(outgrowing, args, families=["rope"])
    assert result.counts["rope"] == 0 and any("broadcast" in s.reason for s in result.skipped)
    assert bits_equal(run(*args), outgrowing(*args))


def test_symbolic_shapes():
    fn = make_rope("interleaved", 1, False)
    run, gm, result = rewrite(fn, make_args("interleaved", 1, False, S=5), families=["rope"], dynamic=True)
    assert result.counts["rope"] == 2
    for S in (3, 9):
        args = make_args("interleaved", 1, False, S=S)
        assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    from sgdiff.kernels.rope import rope
    from sgdiff.kernels.rope_complex import rope_complex
    from sgdiff.kernels.rope_even_odd import rope_even_odd

    x = torch.randn(2, 5, 3, 8, dtype=dtype)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    freqs = torch.polar(torch.ones(5, 1, 4), torch.randn(5, 1, 4))
    for xx in (x, x.transpose(1, 2)):
        c, s = (cos, sin) if xx is x else (cos.transpose(1, 2), sin.transpose(1, 2))
        for interleaved in (True, False):
            torch.library.opcheck(rope, (xx, c, s, interleaved))
        torch.library.opcheck(rope_even_odd, (xx, c[..., 0::2].to(dtype), s[..., 1::2].to(dtype)))
        assert rope(xx, c, s, True).stride() == torch.empty_like(xx).stride()
    torch.library.opcheck(rope_complex, (x, freqs))


def _stack_rope(halves="slices", join=-1, cast_back=True, odd_swapped=False):
    """The even/odd rotation re-interleaved by a stack: ``x1, x2`` the even and odd elements
    (slices, or the unbound pairs), ``stack([x1 cos - x2 sin, x1 sin + x2 cos], join).flatten(-2)``."""
    def fn(x, cos, sin):
        if halves == "slices":
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        odd = x1 * sin + x2 * cos if not odd_swapped else x1 * cos + x2 * sin
        out = torch.stack([x1 * cos - x2 * sin, odd], join).flatten(-2)
        return out.type_as(x) if cast_back else out

    return fn


@given(halves=st.sampled_from(["slices", "unbind"]), dtype=st.sampled_from(DTYPES),
       table_dtype=st.sampled_from([torch.float32, "model"]), B=st.integers(1, 2), S=st.integers(1, 6),
       H=st.integers(1, 3), D=st.sampled_from([2, 8, 12]))
def test_even_odd_re_interleaved_by_a_stack_is_rope_even_odd(halves, dtype, table_dtype, B, S, H, D):
    table_dtype = dtype if table_dtype == "model" else table_dtype
    fn = _stack_rope(halves)

    def both(q, k, cos, sin):
        return fn(q, cos, sin), fn(k, cos, sin)

    g = torch.Generator().manual_seed(S * 7 + D)
    q, k = (torch.randn(B, S, H, D, generator=g).to(dtype) for _ in range(2))
    cos, sin = (torch.randn(1, S, 1, D // 2, generator=g).to(table_dtype) for _ in range(2))
    run, gm, result = rewrite(both, (q, k, cos, sin), families=["rope"])
    assert result.counts["rope"] == 2, result.skipped
    assert count_op(gm, OPS["even_odd"]) == 2 and aten.stack.default not in set(targets(gm))
    for got, want in zip(run(q, k, cos, sin), both(q, k, cos, sin)):
        assert bits_equal(got, want) and got.stride() == want.stride()


def mochi_rope(x, freqs_cos, freqs_sin, upcast=True, cast_dtypes=(None, None)):
    """diffusers' MochiAttnProcessor2_0 apply_rotary_emb, verbatim (upcast, cast_dtypes: near misses)."""
    x_even = x[..., 0::2].float() if upcast else x[..., 0::2]
    x_odd = x[..., 1::2].float() if upcast else x[..., 1::2]
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(cast_dtypes[0] or x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(cast_dtypes[1] or x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_widened_halves_cast_back_before_the_stack_are_rope_even_odd(dtype):
    """Mochi: x's halves .float(), each rotated half cast back to x's dtype before the stack."""
    def both(q, k, cos, sin):
        return mochi_rope(q, cos, sin), mochi_rope(k, cos, sin)

    q, k = (torch.randn(2, 6, 3, 8).to(dtype) for _ in range(2))
    cos, sin = (torch.randn(6, 1, 4) for _ in range(2))  # fp32 [S, 1, D/2] as Mochi's rope module gives
    run, gm, result = rewrite(both, (q, k, cos, sin), families=["rope"])
    assert result.counts["rope"] == 2, result.skipped
    assert count_op(gm, OPS["even_odd"]) == 2 and aten.stack.default not in set(targets(gm))
    assert all(bits_equal(a, b) for a, b in zip(run(q, k, cos, sin), both(q, k, cos, sin)))


@pytest.mark.parametrize("name,fn,reason", [
    ("stacked along another dim", _stack_rope(join=-2), None),
    ("the odd half rotated the other way", _stack_rope(odd_swapped=True), None),
    ("no cast back to bf16", _stack_rope(cast_back=False), "not cast back"),
    ("halves cast back to two dtypes", lambda x, c, s: mochi_rope(x, c, s, cast_dtypes=(None, torch.float16)),
     "not cast back alike"),
    ("halves cast to fp32", lambda x, c, s: mochi_rope(x, c, s, cast_dtypes=(torch.float32, torch.float32)),
     "not cast back"),
    ("widened where bf16 tables would not widen", lambda x, c, s: mochi_rope(x, c.bfloat16(), s.bfloat16()),
     "widened where the tables would not"),
])
def test_stack_near_misses_stay(name, fn, reason):
    args = (torch.randn(2, 5, 3, 8, dtype=torch.bfloat16), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4))
    run, gm, result = rewrite(fn, args, families=["rope"])
    assert count_op(gm, OPS["even_odd"]) == 0, name
    if reason:
        assert any(reason in s.reason for s in result.skipped), result.skipped
    assert bits_equal(run(*args), fn(*args))


# --- the 2x2 rotation-table forms (Kandinsky 5 and 6's sum, PRX's and BFL Flux's select) --------

MATRIX = registry.op_def("rope_matrix").load()


def kandinsky5_rope(x, rope):
    """diffusers' Kandinsky 5 apply_rotary, verbatim (its fixed bfloat16, then type_as)."""
    x_ = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
    return (rope * x_).sum(dim=-1).reshape(*x.shape).to(torch.bfloat16).type_as(x)


def kandinsky6_rope(x, rope):
    """diffusers' Kandinsky 6 apply_rotary, verbatim."""
    x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
    return (rope.float() * x_).sum(dim=-1).reshape(*x.shape).to(dtype=x.dtype)


def prx_rope(xq, freqs_cis):
    """diffusers' PRX apply_rope, verbatim."""
    xq_ = xq.float().reshape(*xq.shape[:-1], -1, 1, 2)
    freqs_cis = freqs_cis.to(device=xq.device, dtype=xq_.dtype)
    xq_out = freqs_cis[..., 0] * xq_[..., 0] + freqs_cis[..., 1] * xq_[..., 1]
    return xq_out.reshape(*xq.shape).type_as(xq)


def _rotation_table(*lead, d, dtype=torch.float32):
    angle = torch.randn(*lead, d // 2)
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([cos, -sin, sin, cos], -1).view(*angle.shape, 2, 2).to(dtype)


@given(fn=st.sampled_from([kandinsky5_rope, kandinsky6_rope, prx_rope]), dtype=st.sampled_from(DTYPES),
       table_dtype=st.sampled_from([torch.float32, torch.bfloat16]), heads_first=st.booleans(),
       per_head=st.booleans(), B=st.integers(1, 2), S=st.integers(1, 6), H=st.integers(1, 3),
       D=st.sampled_from([2, 8, 16]))
def test_rotation_table_spellings_are_one_rope_matrix_site_each(fn, dtype, table_dtype, heads_first, per_head,
                                                                 B, S, H, D):
    x = torch.randn(B, H, S, D, dtype=dtype) if heads_first else torch.randn(B, S, H, D, dtype=dtype)
    lead = (H if per_head else 1, S) if heads_first else (S, H if per_head else 1)
    table = _rotation_table(1, *lead, d=D, dtype=table_dtype)
    run, gm, result = rewrite(fn, (x, table), families=["rope"])
    assert result.counts == {"rope": 1} and count_op(gm, MATRIX) == 1, result.skipped
    assert [t for t in targets(gm) if t != aten._to_copy.default] == [MATRIX]  # (Kandinsky 6's rope.float())
    assert bits_equal(run(x, table), fn(x, table))


def test_an_fp32_x_through_kandinsky5s_fixed_bfloat16_keeps_both_casts():
    x, table = torch.randn(1, 4, 2, 8), _rotation_table(1, 4, 1, d=8)
    run, gm, _ = rewrite(kandinsky5_rope, (x, table), families=["rope"])
    node, = [n for n in gm.graph.nodes if n.target == MATRIX]
    assert node.args[2:] == (True, torch.bfloat16, torch.float32)
    assert bits_equal(run(x, table), kandinsky5_rope(x, table))


def _sum_over(dim):
    def fn(x, rope):
        x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
        return (rope * x_).sum(dim=dim).reshape(*x.shape).to(x.dtype) if dim == -1 else \
            (rope * x_).sum(dim=dim).to(x.dtype)
    return fn


def _bf16_products(x, rope):  # no upcast of a bf16 x: bf16 products
    return (rope.to(x.dtype) * x.reshape(*x.shape[:-1], -1, 1, 2)).sum(-1).reshape(*x.shape)


def _swapped_select(xq, f):  # t[..., 0] against x[..., 1]: another computation
    x_ = xq.float().reshape(*xq.shape[:-1], -1, 1, 2)
    return (f[..., 0] * x_[..., 1] + f[..., 1] * x_[..., 0]).reshape(*xq.shape).type_as(xq)


@pytest.mark.parametrize("name,fn", [
    ("sum over the pair dim's neighbour", _sum_over(-2)),
    ("bf16 products", _bf16_products),
    ("selects swapped", _swapped_select),
])
def test_rotation_table_near_misses_are_not_rewritten(name, fn):
    x, table = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), torch.randn(1, 4, 1, 4, 2, 2)
    run, gm, result = rewrite(fn, (x, table), families=["rope"])
    assert result.counts == {"rope": 0} and count_op(gm, MATRIX) == 0
    assert bits_equal(run(x, table), fn(x, table))


def test_a_table_broadcast_along_its_pairs_is_the_chain_the_kernel_refuses():
    """t of [..., D/2, 2, 1]: each row's one entry times both of x's: a site (the reference is the
    chain), which the kernel does not take (it reads four entries a pair)."""
    from sgdiff.kernels.triton import rope as kernel

    x, table = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), torch.randn(1, 4, 1, 4, 2, 1)
    run, gm, result = rewrite(kandinsky6_rope, (x, table), families=["rope"])
    assert result.counts == {"rope": 1} and bits_equal(run(x, table), kandinsky6_rope(x, table))
    assert not kernel.supported_layout_matrix(x, table, True, None, torch.bfloat16)


def test_allegros_sliced_halves_are_rotate_half_sites():
    """diffusers' apply_rotary_emb_allegro: x cut in thirds (t, h, w axes), each rotated by its
    sliced halves: three rope sites, bitwise eager's."""
    from diffusers.models.embeddings import apply_rotary_emb_allegro

    x = torch.randn(2, 3, 10, 24, dtype=torch.bfloat16)  # [B, H, S, D]
    tables = [(torch.randn(16, 8), torch.randn(16, 8)) for _ in range(3)]
    positions = [torch.randint(0, 16, (2, 10)) for _ in range(3)]

    def fn(x, *flat):
        return apply_rotary_emb_allegro(x, [(flat[0], flat[1]), (flat[2], flat[3]), (flat[4], flat[5])], flat[6:])

    flat = [t for pair in tables for t in pair] + positions
    run, gm, result = rewrite(fn, (x, *flat), families=["rope"])
    assert result.counts == {"rope": 3} and count_op(gm, OPS["rotate_half"]) == 3, result.skipped
    assert bits_equal(run(x, *flat), fn(x, *flat))


def test_halves_cut_off_centre_are_not_rope():
    def fn(x, cos, sin):
        rotated = torch.cat((-x[..., 3:], x[..., :3]), dim=-1)  # D = 8: not the halves
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    x, cos, sin = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), torch.randn(4, 1, 8), torch.randn(4, 1, 8)
    run, gm, result = rewrite(fn, (x, cos, sin), families=["rope"])
    assert result.counts == {"rope": 0} and bits_equal(run(x, cos, sin), fn(x, cos, sin))


def joyimage_rope(xq, cos, sin):
    """diffusers' JoyImage _apply_rotary_emb for one tensor, verbatim: its pairs split from x.float()."""
    def _rotate_half(x):
        x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        return torch.stack([-x_imag, x_real], dim=-1).flatten(3)

    return (xq.float() * cos + _rotate_half(xq) * sin).type_as(xq)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pairs_split_from_the_widened_x_are_interleaved_rope(dtype):
    x, cos, sin = torch.randn(2, 5, 3, 8, dtype=dtype), torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    run, gm, result = rewrite(joyimage_rope, (x, cos, sin), families=["rope"])
    assert result.counts == {"rope": 1} and count_op(gm, OPS["interleaved"]) == 1, result.skipped
    assert bits_equal(run(x, cos, sin), joyimage_rope(x, cos, sin))


def _chunked_rope(rot_dim, swap=False, other=False):
    """ERNIE-Image's and MiniMax H3's RoPE: the leading ``rot_dim`` channels rotated by
    ``x.chunk(2, -1)`` in x's dtype (tables cast to it), the rest concatenated after."""
    def fn(x, cos, sin):
        rot, rest = x[..., :rot_dim], x[..., rot_dim:]
        x1, x2 = (rot.flip(1) if other else rot).chunk(2, dim=-1)
        rotated = torch.cat((x1, -x2) if swap else (-x2, x1), dim=-1)
        return torch.cat((rot * cos.to(x.dtype) + rotated * sin.to(x.dtype), rest), dim=-1)

    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rot_dim", [16, 8])
def test_chunked_partial_rope_is_a_site(dtype, rot_dim):
    x = torch.randn(2, 5, 3, 16).to(dtype)
    cos, sin = torch.randn(1, 5, 1, rot_dim), torch.randn(1, 5, 1, rot_dim)
    fn = _chunked_rope(rot_dim)
    run, gm, result = rewrite(fn, (x, cos, sin), families=["rope"])
    assert result.counts["rope"] == 1 and count_op(gm, OPS["rotate_half"]) == 1, result.skipped
    assert bits_equal(run(x, cos, sin), fn(x, cos, sin))


@pytest.mark.parametrize("name,fn", [("halves swapped", _chunked_rope(16, swap=True)),
                                     ("the halves of another tensor", _chunked_rope(16, other=True))])
def test_chunked_near_misses_are_not_rope(name, fn):
    x = torch.randn(2, 5, 2, 16)
    cos, sin = torch.randn(1, 5, 1, 16), torch.randn(1, 5, 1, 16)
    run, gm, _ = rewrite(fn, (x, cos, sin), families=["rope"])
    assert count_op(gm, OPS["rotate_half"]) == 0, name
    assert bits_equal(run(x, cos, sin), fn(x, cos, sin))


def helios_rope(x, freqs_cis):
    """diffusers' Helios apply_rotary_emb_transposed, verbatim: Wan's even/odd rotation with the
    tables sliced anew for each product (cos[..., 0::2] twice)."""
    x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cis.unsqueeze(-2).chunk(2, dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x_1 * cos[..., 0::2] - x_2 * sin[..., 1::2]
    out[..., 1::2] = x_1 * sin[..., 1::2] + x_2 * cos[..., 0::2]
    return out.type_as(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tables_sliced_anew_for_each_product_are_one_even_odd_site(dtype):
    """The same view of a table taken twice is one operand (fxpasses.views): Helios's RoPE is
    Wan's, one rope_even_odd site on q and one on k."""
    def fn(q, k, freqs):
        return helios_rope(q, freqs), helios_rope(k, freqs)

    q, k = (torch.randn(2, 6, 3, 8).to(dtype) for _ in range(2))
    freqs = torch.randn(2, 6, 16)  # fp32 (cos | sin) per token, as Helios's rope module returns it
    run, gm, result = rewrite(fn, (q, k, freqs), families=["rope"])
    assert result.counts["rope"] == 2 and count_op(gm, registry.op_def("rope_even_odd").load()) == 2
    assert aten.empty_like.default not in targets(gm)
    assert all(bits_equal(a, b) for a, b in zip(run(q, k, freqs), fn(q, k, freqs)))


@pytest.mark.parametrize("name,fn", [
    # cos's even entries in one product, its odd ones in the other: not one table
    ("two slices of cos", lambda x, f: _helios_with(x, f, cos_starts=(0, 1))),
    # the same slice of cos, but of another table in the second product
    ("another table", lambda x, f: _helios_with(x, f, second_table=f.flip(-1))),
])
def test_tables_sliced_differently_are_not_one_operand(name, fn):
    x, freqs = torch.randn(2, 6, 3, 8), torch.randn(2, 6, 16)
    run, gm, result = rewrite(fn, (x, freqs), families=["rope"])
    assert result.counts["rope"] == 0, name
    assert bits_equal(run(x, freqs), fn(x, freqs))


def _helios_with(x, freqs, cos_starts=(0, 0), second_table=None):
    x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs.unsqueeze(-2).chunk(2, dim=-1)
    cos2 = cos if second_table is None else second_table.unsqueeze(-2).chunk(2, dim=-1)[0]
    out = torch.empty_like(x)
    out[..., 0::2] = x_1 * cos[..., cos_starts[0]::2] - x_2 * sin[..., 1::2]
    out[..., 1::2] = x_1 * sin[..., 1::2] + x_2 * cos2[..., cos_starts[1]::2]
    return out


def anyflow_rope(x, freqs):
    """diffusers' AnyFlow apply_rotary_emb, verbatim."""
    x_rotated = torch.view_as_complex(x.to(torch.float64).unflatten(3, (-1, 2)))
    return torch.view_as_real(x_rotated * freqs).flatten(3, 4).type_as(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rope_in_float64_is_a_complex_site(dtype):
    """AnyFlow (and Wan-Animate 2): x.to(torch.float64) times a complex128 table, cast back."""
    def both(q, k, freqs):
        return anyflow_rope(q, freqs), anyflow_rope(k, freqs)

    q, k = (torch.randn(2, 6, 3, 8).to(dtype) for _ in range(2))
    freqs = torch.polar(torch.ones(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64))[None, :, None]
    run, gm, result = rewrite(both, (q, k, freqs), families=["rope"])
    assert result.counts["rope"] == 2 and count_op(gm, OPS["complex"]) == 2, result.skipped
    assert all(bits_equal(a, b) for a, b in zip(run(q, k, freqs), both(q, k, freqs)))


@pytest.mark.parametrize("name,fn", [
    # x widened to fp64 against a complex64 table: the product is complex128 all the same, but the op
    # would widen x to the table's fp32
    ("complex64 table", lambda x, f: anyflow_rope(x, f.to(torch.complex64))),
])
def test_float64_rope_near_misses(name, fn):
    x = torch.randn(2, 6, 3, 8, dtype=torch.bfloat16)
    freqs = torch.polar(torch.ones(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64))[None, :, None]
    run, gm, result = rewrite(fn, (x, freqs), families=["rope"])
    assert result.counts["rope"] == 0, name
    assert bits_equal(run(x, freqs), fn(x, freqs))
