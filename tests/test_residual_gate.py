"""Family `residual_gate`: residual + gate * update, in the spellings DiTs use."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from sgdiff.kernels import registry
from tests.capture import rewrite
from tests.helpers import bits_equal, count_op, targets

aten = torch.ops.aten
OP = registry.op_def("residual_gate").load()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GATES = ["chunk", "unsqueeze", "index", "per_token", "table_temb"]
ORDERS = ["r + g*u", "r + u*g", "g*u + r", "u*g + r"]
CASTS = ["none", "fp32_residual", "fp32_both"]  # Wan: (x.float() + y * gate).type_as(x)


def make_chain(gate_form, order, gate_fn=None, dropout=False, cast="none"):
    """A gated residual spelled the way one diffusers model or another spells it."""

    def gate_of(x, emb, table):
        B, S, D = x.shape
        if gate_form == "chunk":  # Flux2: mod.unsqueeze(1).chunk(...) -> [B, 1, D] views
            return emb[:, None].chunk(2, dim=-1)[1]
        if gate_form == "unsqueeze":  # Flux/SD3: gate_msa.unsqueeze(1)
            return emb.chunk(2, dim=1)[1].unsqueeze(1)
        if gate_form == "index":
            return emb.chunk(2, dim=1)[1][:, None, :]
        if gate_form == "per_token":  # [B, S, D] gates (Wan 2.2 TI2V, QwenImage zero_cond_t)
            return emb.chunk(2, dim=-1)[1]
        return (table[None] + emb.reshape(B, 2, D)).chunk(2, dim=1)[1]  # PixArt/Sana: [B, 1, D]

    def fn(x, y, emb, table):
        g = gate_of(x, emb, table)
        if cast != "none":
            g = g.float()
        if gate_fn == "tanh":  # Lumina: gate_msa.unsqueeze(1).tanh()
            g = g.tanh()
        elif gate_fn == "sigmoid":  # a gate through a sigmoid, after its views
            g = torch.sigmoid(g)
        u = y.clone() if dropout else y  # eval-mode Dropout
        if cast == "fp32_both":
            u = u.float()
        r = x.float() if cast != "none" else x
        prod = {"r + g*u": lambda: r + g * u, "r + u*g": lambda: r + u * g,
                "g*u + r": lambda: g * u + r, "u*g + r": lambda: u * g + r}[order]()
        return prod.type_as(x) if cast != "none" else prod

    return fn


def make_args(gate_form, B=2, S=5, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(B, S, D, generator=g).to(dtype), torch.randn(B, S, D, generator=g).to(dtype)
    emb_shape = (B, S, 2 * D) if gate_form == "per_token" else (B, 2 * D)
    emb = torch.randn(*emb_shape, generator=g).to(dtype)
    table = torch.randn(2, D, generator=g).to(dtype)
    return x, y, emb, table


@given(
    gate_form=st.sampled_from(GATES), order=st.sampled_from(ORDERS),
    gate_fn=st.sampled_from([None, "tanh", "sigmoid"]), dropout=st.booleans(), cast=st.sampled_from(CASTS),
    dtype=st.sampled_from(DTYPES), B=st.integers(1, 3), S=st.integers(1, 9), D=st.sampled_from([4, 8, 12, 36]),
)
def test_every_spelling_is_one_bitexact_site(gate_form, order, gate_fn, dropout, cast, dtype, B, S, D):
    fn = make_chain(gate_form, order, gate_fn, dropout, cast)
    args = make_args(gate_form, B, S, D, dtype)
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1, result.skipped
    assert count_op(gm, OP) == 1
    assert not {aten.mul.Tensor, aten.tanh.default, aten.sigmoid.default} & set(targets(gm))
    if cast != "fp32_both":  # the Dropout copy goes with the chain (unless a cast follows it)
        assert aten.clone.default not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[3] == (gate_fn or "plain")
    # Wan's casts: the op reads the bf16 stream and update and writes the bf16 sum; of the
    # gate's and the update's casts one stays (without it the product would round to bf16)
    casts = 1 if cast != "none" and dtype != torch.float32 else 0
    assert count_op(gm, aten._to_copy.default) == casts, gm.graph
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("gate_fn", [torch.tanh, torch.sigmoid])
def test_a_gate_function_before_the_views_stays_with_the_gate(gate_fn):
    def fn(x, y, g):
        return x + gate_fn(g)[:, None] * y

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args)
    assert result.counts["residual_gate"] == 1 and not {aten.tanh.default, aten.sigmoid.default} & set(targets(gm))
    assert bits_equal(run(*args), fn(*args))


def test_a_sigmoid_gate_is_the_ops_not_an_operand_left_eager():
    """``x * torch.sigmoid(gate) + residual``: the sigmoid goes into the op (gate_kind
    "sigmoid"); a plain gate must not bind the sigmoid's output and leave it a kernel of its own."""
    def fn(r, x, gate):
        return x * torch.sigmoid(gate) + r

    args = tuple(torch.randn(2, 5, 8, dtype=torch.bfloat16) for _ in range(3))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1, result.skipped
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[3] == "sigmoid" and aten.sigmoid.default not in targets(gm)
    assert bits_equal(run(*args), fn(*args))


def test_a_silu_gate_is_no_sigmoid_gate():
    """Near miss: ``x * F.silu(gate) + r`` is a plain gate (the SiLU stays eager)."""
    def fn(r, x, gate):
        return x * F.silu(gate) + r

    args = tuple(torch.randn(2, 5, 8) for _ in range(3))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[3] == "plain" and aten.silu.default in targets(gm)
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sigmoid_gates_match_aten_on_every_value(dtype):
    """The kernel's sigmoid against ATen's CUDA sigmoid: every bf16 and fp16 value (NaNs,
    infinities, subnormals), and fp32 extremes and a million random fp32 values."""
    from sgdiff.kernels.triton import residual_gate as kernel

    if dtype == torch.float32:
        values = torch.cat([torch.tensor([0.0, -0.0, 1e-40, -1e-40, 88.7, -88.7, 104.0, -104.0, float("inf"),
                                          -float("inf"), float("nan")]),
                            torch.randn(1 << 20) * 8]).cuda()
    else:
        values = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
    gate = values[: values.numel() // 16 * 16].view(1, -1, 16)  # per-token gates
    res, upd = torch.zeros_like(gate), torch.ones_like(gate)  # out = sigmoid(gate), rounded
    assert kernel.can_use(res, gate, upd, "sigmoid")
    got, want = kernel.residual_gate(res, gate, upd, "sigmoid"), res + torch.sigmoid(gate) * upd
    assert torch.equal(got.isnan(), want.isnan())
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(got.nan_to_num().view(bits), want.nan_to_num().view(bits))


@pytest.mark.parametrize("residual_first", [True, False])
def test_transposed_token_stream_gives_the_layout_eager_gives(residual_first):
    # The token stream of Sana and PixArt is the transposed patch embedding. Eager's output keeps
    # it when the residual is the first operand (Sana), and is contiguous otherwise (PixArt).
    def fn(x, y, g):
        h = x.flatten(2).transpose(1, 2)
        return h + g[:, None] * y if residual_first else g[:, None] * y + h

    args = (torch.randn(2, 8, 3, 4), torch.randn(2, 12, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args)
    assert result.counts["residual_gate"] == 1
    got, want = run(*args), fn(*args)
    assert want.is_contiguous() != residual_first
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_of_a_linear_on_a_strided_input_folds_in(dropout, dtype):
    # Sana's linear attention: to_out's input is transposed, so ATen runs the linear as bmm and
    # then adds its bias; the op takes the bias and the add goes.
    def fn(x, h, w, b, g):
        u = F.linear(h.transpose(1, 2), w, b)
        return x + g[:, None] * (u.clone() if dropout else u)

    args = tuple(t.to(dtype) for t in (torch.randn(2, 12, 8), torch.randn(2, 8, 12), torch.randn(8, 8),
                                       torch.randn(8), torch.randn(2, 8)))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1
    assert aten.add.Tensor not in targets(gm) and aten.bmm.default in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert len(node.args) == 6 and node.args[5].op == "placeholder"  # the bias
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("name,fn", [
    ("a 2-D addend", lambda x, y, z, g: x + g * (y + z[0])),
    ("a subtracted bias", lambda x, y, z, g: x + g * (y - z[0, 0])),
    ("a scaled bias", lambda x, y, z, g: x + g * torch.add(y, z[0, 0], alpha=2)),
])
def test_near_misses_of_a_bias_stay_outside(name, fn):
    # the gated residual is still found, with the update as it is: no bias folded into it
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(5, 5, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1, name
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert len(node.args) <= 5, name
    assert bits_equal(run(*args), fn(*args))


def test_bias_add_with_another_user_stays():
    def fn(x, y, b, g):
        u = y + b
        return x + g * u, u

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1 and aten.add.Tensor in targets(gm)
    assert len(next(n for n in gm.graph.nodes if n.target == OP).args) <= 5
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


ADD = registry.op_def("residual_add").load()


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("divisor", [1.0, 3.0, 2])
def test_attention_rescale_folds_in(dropout, divisor):
    # PixArt: attn1's output is divided by rescale_output_factor inside the processor, then
    # gated; attn2's (Sana's too) is divided, then added to the stream ungated.
    def fn(x, h, w, b, g):
        u = F.linear(h, w, b)
        u = (u.clone() if dropout else u) / divisor
        x = x + g[:, None] * u
        a = F.linear(h, w, b)
        return (a.clone() if dropout else a) / divisor + x

    args = (torch.randn(2, 12, 8), torch.randn(2, 12, 8), torch.randn(8, 8), torch.randn(8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 2 and aten.div.Tensor not in targets(gm)
    assert count_op(gm, OP) == 1 and count_op(gm, ADD) == 1
    gated = next(n for n in gm.graph.nodes if n.target == OP)
    assert gated.args[6] == divisor
    added = next(n for n in gm.graph.nodes if n.target == ADD)
    assert added.args[2] == divisor and added.args[3] is True  # the update came first
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_keeps_the_operand_order(dtype):
    fn = lambda x, u: x + u / 4.0  # noqa: E731
    args = (torch.randn(2, 5, 8, dtype=dtype).transpose(0, 1).contiguous().transpose(0, 1),
            torch.randn(2, 5, 8, dtype=dtype))  # a strided stream: the order decides eager's layout
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    node = next(n for n in gm.graph.nodes if n.target == ADD)
    assert node.args[3] is False
    got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,fn", [
    ("a tensor divisor", lambda x, u, t: x + u / t),
    ("subtracted", lambda x, u, t: x - u / 2.0),
    ("a scaled add", lambda x, u, t: torch.add(x, u / 2.0, alpha=2)),
    ("not a token stream", lambda x, u, t: x[0] + u[0] / 2.0),
    ("subtracted, scaled", lambda x, u, t: x - 0.5 * u),
    ("scaled by a tensor", lambda x, u, t: x + u * t[0]),
    ("a scaled square", lambda x, u, t: x + 0.5 * u * u),
    ("a scaled add", lambda x, u, t: torch.add(x, 0.5 * u, alpha=2)),
])
def test_near_misses_of_a_rescaled_residual(name, fn):
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert count_op(gm, ADD) == 0, name
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("order", ["x + s*u", "x + u*s", "s*u + x", "u*s + x"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.7, 1.0, 3, 1e-3])
def test_a_residual_scaled_by_a_number_is_one_site(scale, dtype, order, dropout):
    """ConsisID's face injection (``x + local_face_scale * attn(...)``), an IP-Adapter's scaled
    attention: ``residual_add`` with the number, the operand order kept."""
    def fn(x, u):
        u = u.clone() if dropout else u
        return {"x + s*u": lambda: x + scale * u, "x + u*s": lambda: x + u * scale,
                "s*u + x": lambda: scale * u + x, "u*s + x": lambda: u * scale + x}[order]()

    args = (torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 5, 8, dtype=dtype))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1 and count_op(gm, ADD) == 1
    assert aten.mul.Tensor not in targets(gm) and aten.clone.default not in targets(gm)
    node = next(n for n in gm.graph.nodes if n.target == ADD)
    assert node.args[2] is None and node.args[4] == scale and node.args[3] is order.endswith("x")  # update first
    assert bits_equal(run(*args), fn(*args))


def test_a_scaled_update_with_another_user_stays():
    def fn(x, u):
        s = 0.5 * u
        return x + s, s

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert count_op(gm, ADD) == 0 and aten.mul.Tensor in targets(gm)
    assert any("another user" in s.reason for s in result.skipped)


def test_a_quotient_with_another_user_stays():
    def fn(x, u):
        q = u / 2.0
        return x + q, q

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert count_op(gm, ADD) == 0 and aten.div.Tensor in targets(gm)
    assert any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


def test_rotary_embedding_is_not_a_gated_residual():
    # x * cos + x_rot * sin: a sum of two products on [B, S, H, D], for the rope family
    def fn(x, cos, sin):
        real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rot = torch.stack([-imag, real], -1).flatten(3)
        return x * cos + x_rot * sin

    args = (torch.randn(2, 5, 3, 8), torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.passes["residual_gate"].found_count == 0
    assert bits_equal(run(*args), fn(*args))


@pytest.mark.parametrize("name,fn", [
    ("a sum of two products", lambda x, y, g: x * g + y * g),
    ("subtracted", lambda x, y, g: x - g * y),
    ("scaled add", lambda x, y, g: torch.add(x, g * y, alpha=2)),
    ("divided gate", lambda x, y, g: x + y / g),
    ("not a token stream", lambda x, y, g: x[0] + g[0] * y[0]),
])
def test_near_misses_are_not_residual_gates(name, fn):
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert count_op(gm, OP) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_output_broadcasting_beyond_the_residual_is_skipped():
    fn = lambda x, y, g: x + g * y  # noqa: E731
    args = (torch.randn(1, 5, 8), torch.randn(3, 5, 8), torch.randn(3, 1, 8))  # output is [3, 5, 8]
    run, gm, result = rewrite(fn, args)
    assert result.counts["residual_gate"] == 0
    assert any("broadcast" in s.reason for s in result.skipped)
    assert bits_equal(run(*args), fn(*args))


def test_product_with_another_user_is_skipped():
    def fn(x, y, g):
        p = g * y
        return x + p, p

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 1, 8))
    run, gm, result = rewrite(fn, args)
    assert result.counts["residual_gate"] == 0
    assert any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


def test_symbolic_shapes():
    fn = make_chain("unsqueeze", "r + g*u")
    run, gm, result = rewrite(fn, make_args("unsqueeze", S=7), families=["residual_gate"], dynamic=True)
    assert result.counts["residual_gate"] == 1
    for S in (3, 11):
        args = make_args("unsqueeze", S=S)
        assert bits_equal(run(*args), fn(*args))


def test_opcheck():
    from sgdiff.kernels.residual_gate import residual_gate

    for dtype in (torch.float32, torch.bfloat16):
        x, y = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 5, 16, dtype=dtype)
        for gate in (torch.randn(2, 1, 16, dtype=dtype), torch.randn(2, 5, 16), torch.randn(16, dtype=dtype)):
            for gate_kind in ("plain", "tanh", "sigmoid"):
                torch.library.opcheck(residual_gate, (x, gate, y, gate_kind))
        for residual_layout in (False, True):
            args = (x.transpose(0, 1), torch.randn(16, dtype=dtype), y.transpose(0, 1), "plain", residual_layout)
            torch.library.opcheck(residual_gate, args)
            assert residual_gate(*args).is_contiguous() != residual_layout
        torch.library.opcheck(residual_gate, (x, torch.randn(16, dtype=dtype), y, "tanh"))  # 4 args: residual layout
        for bias in (torch.randn(16, dtype=dtype), torch.randn(16)):  # a linear's bias, maybe promoting
            torch.library.opcheck(residual_gate, (x, torch.randn(2, 1, 16, dtype=dtype), y, "plain", True, bias))
        torch.library.opcheck(residual_gate, (x, torch.randn(2, 1, 16, dtype=dtype), y, "plain", True, None, 1.0))
        torch.library.opcheck(ADD, (x, y, 3.0, True))
        torch.library.opcheck(ADD, (x.transpose(0, 1), y.transpose(0, 1), 0.5, False))


@pytest.mark.parametrize("divisor,inverse", [
    (1e-3, 1000.0),  # 1f / 0.001f would be 999.99994: eager's quotients differ from it (H200, torch 2.11)
    (1.1, 0.9090909361839294), (8.0, 0.125), (0.0, float("inf")), (-0.0, -float("inf")), (1e-300, float("inf"))])
def test_the_divisors_reciprocal_is_the_fp64_one_rounded_to_fp32(divisor, inverse):
    from sgdiff.kernels.triton import residual_gate as tk
    assert tk.reciprocal(divisor) == inverse and str(tk.reciprocal(divisor)) == str(inverse)


@pytest.mark.parametrize("divisor,scales", [(1.0, False), (1.00000001, False), (0.9999999, True), (3.0, True),
                                             (-1.0, True), (0.0, True)])
def test_a_reciprocal_of_one_multiplies_nothing(divisor, scales):
    """Sana's ``/ rescale_output_factor`` of 1.0 launches the kernel without the product: so does
    any divisor whose fp32 reciprocal rounds to 1, and no other."""
    from sgdiff.kernels.triton import residual_gate as tk
    assert tk.scales(tk.reciprocal(divisor)) is scales


@pytest.mark.parametrize("shape,dtype,warps", [
    ((2, 1024, 2240), torch.bfloat16, 8), ((2, 1024, 2240), torch.float32, 8), ((1, 4608, 3072), torch.float16, 8),
    ((1, 32760, 1536), torch.bfloat16, 16), ((1, 32760, 5120), torch.float32, 16),
    ((1, 10923, 3073), torch.bfloat16, 16), ((1, 3, 40), torch.bfloat16, 1)])
def test_a_thread_moves_one_16_byte_vector_of_the_residual(shape, dtype, warps):
    """8 warps a program, 16 from Wan's sizes on (2**25 elements), each thread one 16-byte vector
    of the residual; a residual smaller than a program's vectors gets fewer warps, never none."""
    from sgdiff.kernels.triton import residual_gate as tk

    res = torch.empty(shape, dtype=dtype, device="meta")
    gate = torch.empty(shape[0], 1, shape[-1], dtype=dtype, device="meta")
    *_, blocks = tk._plan(res, gate, res.to(torch.bfloat16), None)
    assert blocks["num_warps"] == warps
    vectors = blocks["BLOCK_R"] * blocks["BLOCK_D"] * res.element_size() // 16
    assert vectors == warps * 32 if warps > 1 else vectors <= 32


@pytest.mark.parametrize("gate_fn", [None, "tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_product_cast_before_the_sum_is_the_ops(dtype, gate_fn):
    """Mochi's modulated RMSNorm: ``x + (rms_norm(y.float()) * tanh(gate)).to(x.dtype)``, a 16-bit
    gated residual written through an fp32 product: one site, the cast done by the op."""
    def fn(x, y, gate):
        g = torch.tanh(gate) if gate_fn else gate
        return x + (y.float() * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                    * g[:, None]).to(x.dtype)

    args = (torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 8, dtype=dtype))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1 and count_op(gm, OP) == 1
    node = next(n for n in gm.graph.nodes if n.target == OP)
    assert node.args[-1] == dtype  # product_dtype
    assert not any(n.target is aten._to_copy.default and n.meta["val"].dtype == dtype for n in gm.graph.nodes)
    assert bits_equal(run(*args), fn(*args))


def test_a_product_cast_to_another_dtype_keeps_eagers_dtypes():
    """The product cast to fp16 and added to a bf16 residual: the sum in fp32 (their promotion)."""
    def fn(x, y, gate):
        return x + (y * gate[:, None]).to(torch.float16)

    args = (torch.randn(2, 5, 8, dtype=torch.bfloat16), torch.randn(2, 5, 8), torch.randn(2, 8))
    run, gm, result = rewrite(fn, args, families=["residual_gate"])
    assert result.counts["residual_gate"] == 1
    got, want = run(*args), fn(*args)
    assert got.dtype == want.dtype == torch.float32 and bits_equal(got, want)
