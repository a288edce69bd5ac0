"""Family `linear_attention`: Sana's linear-attention operands (ReLU, fp32 cast, contiguous copy
or padding) as one cast_copy pass each, and its output (normalized by its last row, heads joined,
cast back) as one linear_attention_out pass, or with q's copy and the matmul reading it as one
linear_attention_apply pass; bitwise equal to eager, in eager's layouts."""
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import registry
from tests.capture import rewrite
from tests.helpers import bits_equal, count_op, targets

aten = torch.ops.aten
CAST = registry.op_def("cast_copy").load()
OUT = registry.op_def("linear_attention_out").load()
APPLY = registry.op_def("linear_attention_apply").load()
SCORES = registry.op_def("linear_attention_scores").load()


def sana_linear_attention(C, heads, dtype, seed=0):
    """diffusers' Attention with Sana's linear-attention processor, random weights; a function of
    the tokens and the module's parameters (graph inputs, as torch.compile lifts them)."""
    from diffusers.models.attention_processor import Attention, SanaLinearAttnProcessor2_0

    torch.manual_seed(seed)
    attn = Attention(query_dim=C, heads=heads, dim_head=C // heads, bias=False,
                     processor=SanaLinearAttnProcessor2_0()).to(dtype).eval()
    names = [name for name, _ in attn.named_parameters()]

    def fn(tokens, *params):
        return torch.func.functional_call(attn, dict(zip(names, params)), (tokens,))

    return fn, [p.detach() for p in attn.parameters()]


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 2), N=st.integers(1, 40), heads=st.sampled_from([1, 2, 4]), D=st.sampled_from([4, 8, 32]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_q_k_and_padded_v_are_three_bitexact_sites(B, N, heads, D, dtype):
    fn, params = sana_linear_attention(heads * D, heads, dtype)
    args = (torch.randn(B, N, heads * D).to(dtype), *params)
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    # q and k: a contiguous copy where matmul cannot view them as [B * heads, ., .], else the cast
    # alone; an fp32 model has no cast, so at batch 1, one head or one token its ReLUs stay
    copied = B > 1 and heads > 1 and N > 1
    operands = 3 if dtype != torch.float32 or copied else 1
    output = int(dtype != torch.float32)  # the cast back to the model's dtype
    # where the matmuls copy: v's and k's copies and the first matmul, one linear_attention_scores;
    # q's copy, the second matmul and the output, one linear_attention_apply (two chains each)
    scored, applied = int(copied), int(bool(output) and copied)
    assert result.counts["linear_attention"] == operands + output and not result.skipped, result.skipped
    assert count_op(gm, CAST) == operands - 2 * scored - applied and count_op(gm, OUT) == output - applied
    eager_bmms = count_op(rewrite(fn, args, families=[])[1], aten.bmm.default)
    assert (count_op(gm, SCORES), count_op(gm, APPLY)) == (scored, applied)
    assert count_op(gm, aten.bmm.default) == eager_bmms - scored - applied
    assert aten.constant_pad_nd.default not in targets(gm) and (aten.relu.default in targets(gm)) == (operands == 1)
    assert (aten.div.Tensor in targets(gm)) == (not output)
    with torch.no_grad():
        got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


def qkv(dtype=torch.bfloat16, B=2, H=2, D=8, N=12):
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(B, N, H * D, generator=g).to(dtype)
    return (proj.transpose(1, 2).unflatten(1, (H, -1)),)  # [B, H, D, N], as the processor views it


@pytest.mark.parametrize("name,fn,sites", [
    ("padding before the start", lambda q: F.pad(q.float(), (0, 0, 1, 0), value=1.0), 0),
    ("padding along the batch", lambda q: F.pad(q.float(), (0, 0, 0, 0, 0, 1), value=1.0), 0),
    # the copy is of a broadcast: it stays, and only the ReLU + cast before it fuse
    ("a copy of a broadcast", lambda q: torch.relu(q).float()[:, :1].expand(-1, 2, -1, -1).contiguous(), 1),
    ("sigmoid, not relu", lambda q: torch.sigmoid(q).float().contiguous(), 0),
    ("a cast to an integer", lambda q: torch.relu(q).int().contiguous(), 0),
])
def test_near_misses_are_not_cast_copy(name, fn, sites):
    args = qkv()
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert count_op(gm, CAST) == sites, name
    assert all(not n.args[-1] for n in gm.graph.nodes if n.target is CAST)  # none writes a contiguous copy
    got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


def test_relu_with_another_user_is_skipped():
    def fn(q):
        r = torch.relu(q)
        return r.float().contiguous(), r

    args = qkv()
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert result.counts["linear_attention"] == 0 and any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


def test_opcheck():
    from sgdiff.kernels.cast_copy import cast_copy

    (q,) = qkv()
    torch.library.opcheck(cast_copy, (q, torch.float32, True, [], 0.0, True))
    torch.library.opcheck(cast_copy, (q, torch.float32, False, [0, 0, 0, 1], 1.0, True))
    torch.library.opcheck(cast_copy, (q.transpose(2, 3), torch.float32, True, [], 0.0, False))


def test_cast_copy_kernel_refuses_grids_past_its_axes():
    """The kernel's slices and row tiles go on grid axes 2 and 1 (at most 65535 each): past them
    it refuses, and the op runs the eager chain."""
    pytest.importorskip("triton")
    from sgdiff.kernels.triton import cast_copy as tcast

    def ok(shape, pad=()):
        return tcast.supported_layout(torch.empty(shape, device="meta", dtype=torch.bfloat16), torch.float32,
                                      True, list(pad), 0.0, True)

    assert ok((2, 70, 32, 1024)) and ok((1, 65535, 32, 8)) and ok((1, 2, 65534, 8), (0, 0, 0, 1))
    assert not ok((1, 65536, 32, 8)) and not ok((2, 32768, 32, 8)) and not ok((1, 2, 65535, 8), (0, 0, 0, 1))


def _cast_copy_loads(shape, pad, transposed=True):
    """The global loads in the PTX (sm_90, compiled on the CPU) of cast_copy's kernel as a launch
    of a bf16 ``x`` of ``shape`` (Sana's transposed view of a projection, or contiguous) compiles
    it: its sizes, strides and warps in, a ReLU where there is no padding."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sgdiff.kernels.triton import cast_copy as tcast

    B, H, D, N = shape
    x = torch.empty(B, N, H * D, device="meta").transpose(1, 2).unflatten(1, (H, D)) if transposed \
        else torch.empty(shape, device="meta")
    _, _, _, consts, warps = tcast._plan(x, tuple(pad), True)
    fn = tcast._cast_copy_kernel.fn
    sig = {n: {"x_ptr": "*bf16", "out_ptr": "*fp32", "value": "fp32"}.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    src = ASTSource(fn, sig, constexprs=dict(consts, RELU=not any(pad)), attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, enable_fp_fusion=False)).asm["ptx"]
    return re.findall(r"^\s*(@%p\d+\s+)?ld\.global\S*", ptx, re.M)


def test_cast_copy_masks_its_loads_only_where_the_grid_passes_the_input():
    """Sana's q (tiles that fit, no padding): no load is predicated. A padded copy's grid covers
    the output, one row longer than the input, so every load is (64 rows padded to 65 take two
    64-row tiles: the second reads past the input, with tiles that fit the input exactly)."""
    loads = _cast_copy_loads((2, 70, 32, 1024), ())
    assert loads and not any(pred for pred in loads)
    for shape, transposed in (((1, 2, 64, 128), True), ((1, 2, 64, 128), False), ((2, 70, 32, 1024), True)):
        loads = _cast_copy_loads(shape, (0, 0, 0, 1), transposed)
        assert loads and all(pred for pred in loads), shape


def test_cast_copy_merges_heads_whose_rows_continue():
    """Sana's q, a view of the projection's 2240 channels: one [2, 2240, 1024] transpose in
    64-row tiles on 8 warps. Padded (v), or heads apart in memory: a head at a time."""
    pytest.importorskip("triton")
    from sgdiff.kernels.triton import cast_copy as tcast

    q = torch.empty(2, 1024, 2240, device="meta").transpose(1, 2).unflatten(1, (70, 32))
    _, _, grid, consts, warps = tcast._plan(q, (), True)
    assert (grid, warps) == ((32, 35, 2), 8)
    assert (consts["N1"], consts["I_IN"], consts["I_OUT"], consts["SX2"], consts["SO2"]) == (1, 2240, 2240, 1, 1024)
    _, _, grid, consts, warps = tcast._plan(q, (0, 0, 0, 1), True)
    assert (grid, warps, consts["N1"], consts["I_OUT"]) == ((32, 1, 140), 4, 70, 33)
    apart = torch.empty(2, 1024, 32, 70, device="meta").permute(0, 3, 2, 1)  # heads innermost
    _, _, grid, consts, warps = tcast._plan(apart, (), True)
    assert (grid, warps, consts["N1"]) == ((32, 1, 140), 4, 70)


def attention_output(B=2, H=3, D=4, N=5):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, D + 1, N, generator=g) * 3,)


def processor_output(h, eps=1e-15, dtype=torch.bfloat16):
    h = h[:, :, :-1] / (h[:, :, -1:] + eps)
    return h.flatten(1, 2).transpose(1, 2).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_output_is_one_bitexact_site(dtype):
    fn = lambda h: processor_output(h, dtype=dtype)  # noqa: E731
    args = attention_output()
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert result.counts["linear_attention"] == 1 and count_op(gm, OUT) == 1
    assert aten.div.Tensor not in targets(gm) and aten._to_copy.default not in targets(gm)
    got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,fn", [
    ("two rows as the normalizer", lambda h: (h[:, :, :-2] / (h[:, :, -2:-1] + 1e-15)).flatten(1, 2).transpose(1, 2)
     .to(torch.bfloat16)),
    ("heads joined without the transpose", lambda h: (h[:, :, :-1] / (h[:, :, -1:] + 1e-15)).flatten(1, 2)
     .to(torch.bfloat16)),
    ("subtracted, not divided", lambda h: (h[:, :, :-1] - (h[:, :, -1:] + 1e-15)).flatten(1, 2).transpose(1, 2)
     .to(torch.bfloat16)),
])
def test_near_misses_are_not_linear_attention_out(name, fn):
    args = attention_output()
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert count_op(gm, OUT) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_output_opcheck():
    from sgdiff.kernels.linear_attention_out import linear_attention_out

    (h,) = attention_output()
    torch.library.opcheck(linear_attention_out, (h, 1e-15, torch.bfloat16))


def second_matmul(scores, q, keep=None, relu=torch.relu, dtype=torch.bfloat16):
    """The processor's second matmul and output on the [B, heads, D, N] view q; ``keep`` names an
    intermediate also returned (another user of it)."""
    qf = relu(q).float()
    h = torch.matmul(scores, qf)
    out = processor_output(h, dtype=dtype)
    return (out, {"qf": qf, "h": h}[keep]) if keep else out


def matmul_operands(B=2, H=2, D=8, N=12):
    g = torch.Generator().manual_seed(1)
    (q,) = qkv(B=B, H=H, D=D, N=N)
    return torch.randn(B, H, D + 1, D, generator=g), q


def test_second_matmul_and_output_are_one_bitexact_site():
    """h = scores @ relu(q).float() normalized: q's copy, the matmul and the output as one
    linear_attention_apply reading q's view (two of the family's chains), bitwise eager's."""
    args = matmul_operands()
    run, gm, result = rewrite(second_matmul, args, families=["linear_attention"])
    assert result.counts["linear_attention"] == 2 and count_op(gm, APPLY) == 1
    assert count_op(gm, CAST) == 0 and count_op(gm, OUT) == 0 and aten.bmm.default not in targets(gm)
    got, want = run(*args), second_matmul(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,kw,sites", [
    # h also returned: the matmul stays, and q's copy and the output are two sites of their own
    ("h with another user", dict(keep="h"), dict(cast=1, out=1)),
    # q's fp32 cast also returned: the ReLU and cast fuse (the cast is that site's output), the matmul
    # copies it contiguous as eager does, and the output is a site of its own
    ("q's cast with another user", dict(keep="qf"), dict(cast=1, out=1)),
    ("sigmoid, not relu", dict(relu=torch.sigmoid), dict(cast=0, out=1)),
    ("no cast back", dict(dtype=torch.float32), dict(cast=1, out=0)),
])
def test_near_misses_of_the_second_matmul(name, kw, sites):
    args = matmul_operands()
    fn = lambda *a: second_matmul(*a, **kw)  # noqa: E731
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert count_op(gm, APPLY) == 0 and aten.bmm.default in targets(gm), name
    assert (count_op(gm, CAST), count_op(gm, OUT)) == (sites["cast"], sites["out"]), name
    got, want = run(*args), fn(*args)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert bits_equal(a, b) and a.stride() == b.stride()


def test_apply_opcheck_and_refusals():
    from sgdiff.kernels.linear_attention_apply import linear_attention_apply
    from sgdiff.kernels.triton import linear_attention_apply as tapply

    scores, q = matmul_operands()
    scores = scores.flatten(0, 1)
    torch.library.opcheck(linear_attention_apply, (scores, q, 1e-15, torch.bfloat16))
    assert tapply.supported_layout(scores, q, 1e-15, torch.bfloat16)
    assert not tapply.supported_layout(scores.double(), q, 1e-15, torch.bfloat16)  # fp32 scores only
    assert not tapply.supported_layout(scores[:, :-1], q, 1e-15, torch.bfloat16)  # no normalizer row
    wide = torch.empty(2, 2, 256, 12, device="meta")
    assert not tapply.supported_layout(torch.empty(4, 257, 256, device="meta"), wide, 1e-15, torch.bfloat16)


def first_matmul(v, k, rows=1, act=torch.relu, keep=None):
    """The processor's first matmul on the [B, heads, D, N] and [B, heads, N, D] views; ``keep``
    names an intermediate also returned (another user of it)."""
    vp = F.pad(v.float(), (0, 0, 0, rows), mode="constant", value=1.0)
    kf = act(k).float()
    scores = torch.matmul(vp, kf)
    return (scores, {"vp": vp, "kf": kf}[keep]) if keep else scores


def first_operands(B=2, H=2, D=8, N=12, dtype=torch.bfloat16):
    (v,) = qkv(dtype, B, H, D, N)
    g = torch.Generator().manual_seed(2)
    k = torch.randn(B, N, H * D, generator=g).to(dtype).transpose(1, 2).unflatten(1, (H, D)).transpose(2, 3)
    return v, k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_first_matmul_is_one_bitexact_site(dtype):
    """pad(v.float(), ones) @ relu(k).float(): v's padded copy, k's copy and the matmul as one
    linear_attention_scores reading both views (two of the family's chains), bitwise eager's."""
    args = first_operands(dtype=dtype)
    run, gm, result = rewrite(first_matmul, args, families=["linear_attention"])
    assert result.counts["linear_attention"] == 2 and count_op(gm, SCORES) == 1
    assert count_op(gm, CAST) == 0 and aten.bmm.default not in targets(gm)
    got, want = run(*args), first_matmul(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,kw,casts", [
    ("two padded rows", dict(rows=2), 2),  # v's padded copy and k's copy stay cast_copy sites
    ("sigmoid, not relu", dict(act=torch.sigmoid), 1),  # k is no site: v's padded copy alone
    ("v's padded copy with another user", dict(keep="vp"), 2),  # the pad is that site's output; k's copy another
    ("k's cast with another user", dict(keep="kf"), 2),
])
def test_near_misses_of_the_first_matmul(name, kw, casts):
    args = first_operands()
    fn = lambda *a: first_matmul(*a, **kw)  # noqa: E731
    run, gm, result = rewrite(fn, args, families=["linear_attention"])
    assert count_op(gm, SCORES) == 0 and aten.bmm.default in targets(gm), name
    assert count_op(gm, CAST) == casts, name
    got, want = run(*args), fn(*args)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert bits_equal(a, b) and a.stride() == b.stride()


def test_scores_opcheck_and_refusals():
    from sgdiff.kernels.linear_attention_scores import linear_attention_scores
    from sgdiff.kernels.triton import linear_attention_scores as tscores

    v, k = first_operands()
    torch.library.opcheck(linear_attention_scores, (v, k, 1.0))
    assert tscores.supported_layout(v, k, 1.0)
    assert not tscores.supported_layout(v, k.float(), 1.0)  # one dtype
    assert not tscores.supported_layout(v, k.transpose(2, 3), 1.0)  # k as [B, heads, tokens, head_dim]
    wide = torch.empty(1, 1, tscores.MAX_HEAD_DIM * 2, 4, device="meta")
    assert not tscores.supported_layout(wide, wide.transpose(2, 3), 1.0)  # head_dim past the largest tried
    head_128 = torch.empty(1, 1, 128, 4, device="meta")
    assert tscores.supported_layout(head_128, head_128.transpose(2, 3), 1.0)  # tiles of a head: any to the largest
