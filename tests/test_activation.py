"""Family `activation`: silu(a) * b and cat([head, gelu_tanh(x)]) (bit-exact), and bias +
GELU-tanh after a linear (close)."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from sgdiff.kernels import registry
from tests.capture import rewrite
from tests.helpers import (LINEAR_GELU_SHARE as SHARE, NOT_ADMITTED, assert_linear_gelu_contract, bits_equal, count_op,
                           not_admitted, targets)

aten = torch.ops.aten
SILU_MUL = registry.op_def("silu_mul").load()
LINEAR_GELU = registry.op_def("linear_gelu_tanh").load()
GELU_CAT = registry.op_def("gelu_tanh_cat").load()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPLITS = ["slices", "chunk", "split", "gate_second", "two_projections", "conv_chunk"]


def make_glu(split, swap=False):
    """A gated activation spelled the way one model or another spells it."""

    def fn(x, w1, w2):
        if split == "two_projections":  # LLaMA-style: silu(w1(x)) * w3(x)
            a, b = F.linear(x, w1), F.linear(x, w2)
        elif split == "conv_chunk":  # Sana GLUMBConv: a channels-last convolution, chunked
            h = F.conv2d(x.permute(0, 2, 1).unflatten(-1, (1, -1)), w1[:, :, None, None])
            b, a = h.chunk(2, dim=1)
        else:
            h = F.linear(x, w1)
            half = h.shape[-1] // 2
            if split == "slices":  # Flux2SwiGLU: silu(x[..., :half]) * x[..., half:]
                a, b = h[..., :half], h[..., half:]
            elif split == "chunk":
                a, b = h.chunk(2, dim=-1)
            elif split == "split":
                a, b = h.split(half, dim=-1)
            else:  # Sana: hidden, gate = chunk(2); hidden * silu(gate)
                b, a = h.chunk(2, dim=-1)
        return b * F.silu(a) if swap else F.silu(a) * b

    return fn


def make_args(B=2, S=5, D=8, N=12, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, D, generator=g).to(dtype), torch.randn(2 * N, D, generator=g).to(dtype),
            torch.randn(2 * N, D, generator=g).to(dtype))


@given(
    split=st.sampled_from(SPLITS), swap=st.booleans(), dtype=st.sampled_from(DTYPES),
    B=st.integers(1, 3), S=st.integers(1, 9), D=st.sampled_from([4, 8, 16]), N=st.sampled_from([3, 8, 12]),
)
def test_every_gated_activation_is_one_bitexact_site(split, swap, dtype, B, S, D, N):
    fn = make_glu(split, swap)
    args = make_args(B, S, D, N, dtype)
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert result.counts["activation"] == 1, result.skipped
    assert count_op(gm, SILU_MUL) == 1 and aten.silu.default not in targets(gm)
    got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,fn", [
    ("a broadcast multiplier", lambda a, b: F.silu(a) * b[:, :1]),
    ("sigmoid, not silu", lambda a, b: torch.sigmoid(a) * b),
    ("silu added", lambda a, b: F.silu(a) + b),
])
def test_near_misses_are_not_silu_mul(name, fn):
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert count_op(gm, SILU_MUL) == 0, name
    assert bits_equal(run(*args), fn(*args))


GELU_MUL = registry.op_def("gelu_mul").load()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spelling", ["up * gelu(gate)", "gelu(gate) * up", "GEGLU halves"])
def test_a_geglu_is_one_bitexact_site(dtype, spelling):
    """diffusers' GEGLU (halves of one projection) and ERNIE's ``up(x) * gelu(gate(x))``."""
    g = torch.Generator().manual_seed(3)
    h = (torch.randn(2, 5, 32, generator=g) * 3).to(dtype)

    def fn(h):
        if spelling == "GEGLU halves":
            hidden, gate = h.chunk(2, dim=-1)
            return hidden * F.gelu(gate)
        up, gate = h[..., :16] + 1, h[..., 16:] * 2
        return up * F.gelu(gate) if spelling.startswith("up") else F.gelu(gate) * up

    run, gm, result = rewrite(fn, (h,), families=["activation"])
    assert result.counts["activation"] == 1 and count_op(gm, GELU_MUL) == 1, result.skipped
    assert aten.gelu.default not in targets(gm)
    got, want = run(h), fn(h)
    assert bits_equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("name,fn", [
    ("the tanh GELU", lambda a, b: F.gelu(a, approximate="tanh") * b),
    ("a broadcast multiplier", lambda a, b: F.gelu(a) * b[:, :1]),
    ("GELU added", lambda a, b: F.gelu(a) + b),
])
def test_near_misses_are_not_gelu_mul(name, fn):
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert count_op(gm, GELU_MUL) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_silu_with_another_user_is_skipped():
    def fn(a, b):
        s = F.silu(a)
        return s * b, s

    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert result.counts["activation"] == 0 and any("another user" in s.reason for s in result.skipped)


def single_block(attn_layout="heads_last"):
    """Flux single block: the attention output and the GELU-tanh MLP, side by side."""

    def fn(q, x, w, b):
        B, H, S, D = q.shape
        if attn_layout == "heads_last":  # SDPA output [B, H, S, D] -> [B, S, H * D]
            attn = q.transpose(1, 2).flatten(2, 3)
        else:
            attn = q.permute(0, 2, 1, 3).reshape(B, S, H * D) * 2
        mlp = F.gelu(F.linear(x, w, b), approximate="tanh")
        return torch.cat([attn, mlp], dim=2)

    return fn


def single_block_args(B, H, S, D, K, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, S, D, generator=g).to(dtype), (torch.randn(B, S, K, generator=g) * 3).to(dtype),
            (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype), torch.randn(N, generator=g).to(dtype))


@given(
    layout=st.sampled_from(["heads_last", "copied"]), dtype=st.sampled_from(DTYPES), B=st.integers(1, 2),
    H=st.integers(1, 3), S=st.integers(1, 9), D=st.sampled_from([2, 8, 16]), N=st.sampled_from([4, 24, 40]),
    quality=st.sampled_from(["lossless", "extra-high"]),
)
def test_gelu_into_cat_is_one_bitexact_site(layout, dtype, B, H, S, D, N, quality):
    fn, args = single_block(layout), single_block_args(B, H, S, D, 8, N, dtype)
    run, gm, result = rewrite(fn, args, quality=quality, families=["activation"])
    # at extra-high too: the cat takes its GELU before the (close) linear + GELU could
    assert result.counts["activation"] == 1 and count_op(gm, GELU_CAT) == 1 and count_op(gm, LINEAR_GELU) == 0
    assert aten.gelu.default not in targets(gm) and aten.cat.default not in targets(gm)
    got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.is_contiguous()


@pytest.mark.parametrize("name,fn", [
    ("GELU first", lambda h, x: torch.cat([F.gelu(x, approximate="tanh"), h], dim=-1)),
    ("erf GELU", lambda h, x: torch.cat([h, F.gelu(x)], dim=-1)),
    ("cat along tokens", lambda h, x: torch.cat([h, F.gelu(x, approximate="tanh")], dim=1)),
    ("three inputs", lambda h, x: torch.cat([h, F.gelu(x, approximate="tanh"), h], dim=-1)),
    ("dtypes promoted", lambda h, x: torch.cat([h.float(), F.gelu(x, approximate="tanh")], dim=-1)),
])
def test_near_misses_are_not_gelu_tanh_cat(name, fn):
    args = (torch.randn(2, 6, 8, dtype=torch.bfloat16), torch.randn(2, 6, 8, dtype=torch.bfloat16))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert count_op(gm, GELU_CAT) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_gelu_with_another_user_stays_out_of_the_cat():
    def fn(h, x):
        g = F.gelu(x, approximate="tanh")
        return torch.cat([h, g], dim=-1), g

    args = (torch.randn(2, 6, 8), torch.randn(2, 6, 8))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert result.counts["activation"] == 0 and any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


def ff_gelu(bias=True):
    def fn(x, w, b):  # diffusers GELU(approximate="tanh"): proj, then gelu
        return F.gelu(F.linear(x, w, b if bias else None), approximate="tanh")

    return fn


def gelu_args(dtype, B=2, S=64, K=32, N=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, K, generator=g).to(dtype), (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype),
            torch.randn(N, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gelu_is_close_not_lossless(dtype, bias):
    fn, args = ff_gelu(bias), gelu_args(dtype)
    run, gm, result = rewrite(fn, args, quality="lossless", families=["activation"])
    assert result.counts["activation"] == 0 and count_op(gm, LINEAR_GELU) == 0
    assert [s.reason for s in result.skipped] == [NOT_ADMITTED]
    assert bits_equal(run(*args), fn(*args))
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert result.counts["activation"] == 1 and count_op(gm, LINEAR_GELU) == 1
    assert aten.gelu.default not in targets(gm)
    got, want = run(*args), fn(*args)
    if dtype == torch.float32:  # one fp32 pass is the eager chain itself
        assert bits_equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 32, 128), (333, 96, 384), (1024, 256, 1024)])  # K, N as in tiny/full FFs
def test_linear_gelu_tolerance(dtype, shape):
    # the contract written in the registry: measured here against eager's two roundings
    S, K, N = shape
    x, w, b = gelu_args(dtype, S=S, K=K, N=N)
    assert_linear_gelu_contract(LINEAR_GELU(x, w, b), ff_gelu()(x, w, b), SHARE[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["transposed", "2d", "no_bias"])
def test_cublaslt_linear_gelu_plumbing(dtype, layout):
    """The cuBLASLt implementation's plumbing, run here through ATen's CPU ``_addmm_activation``
    (tests/gpu checks cuBLASLt against the op's contract): any layout of x gives the bits of its
    contiguous rows, a missing bias those of a zero bias, and the output is contiguous, of the
    reference's shape and dtype."""
    from sgdiff.kernels import cublaslt

    x, w, b = gelu_args(dtype, S=33, K=64, N=96)
    x = {"transposed": x.transpose(0, 1), "2d": x[0]}.get(layout, x)
    b = None if layout == "no_bias" else b
    got = cublaslt.linear_gelu_tanh(x, w, b)
    want = LINEAR_GELU(x, w, b)
    assert got.shape == want.shape and got.is_contiguous() and got.dtype == dtype
    rows = cublaslt.linear_gelu_tanh(x.contiguous().view(-1, 64), w, torch.zeros_like(w[:, 0]) if b is None else b)
    assert bits_equal(got, rows.view(got.shape))
    if dtype == torch.bfloat16 and layout != "transposed":  # eager rounds a strided x's GEMM apart
        assert_linear_gelu_contract(got, F.gelu(F.linear(x, w, b), approximate="tanh"), SHARE[dtype])


def test_cublaslt_linear_gelu_serves_half_precision_on_cuda_only():
    from sgdiff.kernels import cublaslt

    spec = next(s for s in registry.kernel_specs("linear_gelu_tanh") if s.backend == "cublaslt")
    assert spec.supports("cuda", "bfloat16") and spec.supports("cuda", "float16")
    assert not spec.supports("cuda", "float32") and not spec.supports("cpu", "bfloat16")
    x, w, b = gelu_args(torch.bfloat16)
    assert cublaslt.supported_layout(x, w, b) and cublaslt.supported_layout(x, w, None)
    assert not cublaslt.can_use(x, w, b)  # on the CPU
    assert not cublaslt.supported_layout(x.float(), w.float(), b.float())  # fp32: the reference is eager
    assert not cublaslt.supported_layout(x, w.half(), b)
    assert not cublaslt.supported_layout(x, w, b[:-1])
    assert not cublaslt.supported_layout(x[..., :-1], w, b)
    assert not cublaslt.supported_layout(x[:0], w, b)


def test_gelu_without_tanh_is_not_matched():
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    args = gelu_args(torch.float32)
    run, gm, result = rewrite(fn, args, quality="high", families=["activation"])
    assert result.passes["activation"].found_count == 0
    assert bits_equal(run(*args), fn(*args))


def test_opcheck():
    from sgdiff.kernels.gelu_tanh_cat import gelu_tanh_cat
    from sgdiff.kernels.linear_gelu_tanh import linear_gelu_tanh
    from sgdiff.kernels.silu_mul import silu_mul

    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(2, 5, 16, dtype=dtype)
        torch.library.opcheck(silu_mul, (h[..., :8], h[..., 8:]))
        torch.library.opcheck(silu_mul, (torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 5, 8, dtype=dtype)))
        x, w, b = gelu_args(dtype, S=5, K=8, N=12)
        torch.library.opcheck(linear_gelu_tanh, (x, w, b))
        torch.library.opcheck(linear_gelu_tanh, (x[0], w, None))
        torch.library.opcheck(gelu_tanh_cat, (torch.randn(2, 5, 3, dtype=dtype), torch.randn(2, 5, 7, dtype=dtype)))


# --- Sana's GLUMBConv: biased convolutions and their SiLU / gated SiLU ------------------

CONV_SILU = registry.op_def("conv_silu").load()
CONV_SILU_MUL = registry.op_def("conv_silu_mul").load()


def glumbconv(C, ratio, dtype, seed=0):
    """diffusers' own GLUMBConv (Sana's feed-forward), random weights, channels-last input as
    Sana's block feeds it (tokens unflattened, then permuted to NCHW)."""
    from diffusers.models.transformers.sana_transformer import GLUMBConv

    torch.manual_seed(seed)
    return GLUMBConv(C, C, expand_ratio=ratio).to(dtype).eval()


@given(C=st.sampled_from([4, 8, 12]), ratio=st.sampled_from([1, 2.5]), B=st.integers(1, 2), H=st.integers(1, 5),
       W=st.integers(1, 6), dtype=st.sampled_from(DTYPES))
def test_glumbconv_is_two_bitexact_conv_sites(C, ratio, B, H, W, dtype):
    ff = glumbconv(C, ratio, dtype)
    names = [name for name, _ in ff.named_parameters()]

    def fn(tokens, *params):  # the module's parameters as graph inputs, as torch.compile lifts them
        return torch.func.functional_call(ff, dict(zip(names, params)), (tokens.unflatten(1, (H, W)).permute(0, 3, 1, 2),))

    args = (torch.randn(B, H * W, C).to(dtype), *(p.detach() for p in ff.parameters()))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert result.counts["activation"] == 2, result.skipped
    # a half-precision conv_inverted is also extra-high's pointwise_conv_act: said, not taken
    assert [s.op for s in result.skipped] == (["pointwise_conv_act"] if dtype != torch.float32 else [])
    assert all(not_admitted(s.reason) for s in result.skipped)
    assert count_op(gm, CONV_SILU) == 1 and count_op(gm, CONV_SILU_MUL) == 1 and count_op(gm, SILU_MUL) == 0
    assert aten.silu.default not in targets(gm) and aten.split.Tensor not in targets(gm)
    assert sum(t == aten.convolution.default for t in targets(gm)) == 1  # conv_point keeps its own
    with torch.no_grad():
        got, want = run(*args), fn(*args)
    assert bits_equal(got, want) and got.stride() == want.stride()


def conv_args(dtype=torch.float32, C=4, K=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, C, 5, 6, generator=g).to(dtype).to(memory_format=torch.channels_last)
    return x, torch.randn(K, C, 1, 1, generator=g).to(dtype), torch.randn(K, generator=g).to(dtype)


def reversed_halves(x, w, b):
    gate, a = F.conv2d(x, w, b).chunk(2, dim=1)
    return a * F.silu(gate)


@pytest.mark.parametrize("name,fn,silu_mul_sites", [
    ("no bias", lambda x, w, b: F.silu(F.conv2d(x, w)), 0),
    ("no bias, gated", lambda x, w, b: (lambda a, g: a * F.silu(g))(*F.conv2d(x, w).chunk(2, dim=1)), 1),
    ("transposed convolution", lambda x, w, b: F.silu(F.conv_transpose2d(x, w.transpose(0, 1), b)), 0),
    ("SiLU on the first half", reversed_halves, 1),
    ("thirds, not halves", lambda x, w, b: (lambda a, g, _: a * F.silu(g))(*F.conv2d(x, w, b).chunk(3, dim=1)), 1),
    ("chunked along height", lambda x, w, b: (lambda a, g: a * F.silu(g))(*F.conv2d(x, w, b)[:, :, :4].chunk(2, 2)), 1),
    ("sigmoid, not SiLU", lambda x, w, b: torch.sigmoid(F.conv2d(x, w, b)), 0),
])
def test_near_misses_are_not_conv_epilogues(name, fn, silu_mul_sites):
    args = conv_args()
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert count_op(gm, CONV_SILU) == 0 and count_op(gm, CONV_SILU_MUL) == 0, name
    assert count_op(gm, SILU_MUL) == silu_mul_sites, name
    assert bits_equal(run(*args), fn(*args))


def test_convolution_with_another_user_is_skipped():
    def fn(x, w, b):
        y = F.conv2d(x, w, b)
        return F.silu(y), y

    args = conv_args()
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert result.counts["activation"] == 0 and any("another user" in s.reason for s in result.skipped)
    assert all(bits_equal(a, b) for a, b in zip(run(*args), fn(*args)))


def test_conv_opcheck():
    from sgdiff.kernels.conv_silu import conv_silu
    from sgdiff.kernels.conv_silu_mul import conv_silu_mul

    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = conv_args(dtype)
        torch.library.opcheck(conv_silu, (x, w, b, [1, 1], [0, 0], [1, 1], 1))
        torch.library.opcheck(conv_silu_mul, (x, w, b, [1, 1], [0, 0], [1, 1], 1))
        dw, db = torch.randn(4, 1, 3, 3, dtype=dtype), torch.randn(4, dtype=dtype)  # Sana's depthwise conv
        torch.library.opcheck(conv_silu_mul, (x, dw, db, [1, 1], [1, 1], [1, 1], 4))


def test_conv_kernel_refuses_what_it_cannot_do():
    from sgdiff.kernels.triton import conv_silu as tconv

    x, w, b = conv_args()
    geometry = ([1, 1], [0, 0], [1, 1], 1)
    assert tconv.supported_layout(x, w, b, *geometry) and tconv.supported_layout(x, w, b, *geometry, halves=True)
    assert not tconv.supported_layout(x, w, None, *geometry)  # no bias to fold
    assert not tconv.supported_layout(x, w, b.double(), *geometry)  # mixed dtypes
    assert not tconv.supported_layout(x[:, :, 0], w[..., 0], b, *geometry)  # a 1-D convolution
    assert not tconv.supported_layout(x, w[:7], b[:7], *geometry, halves=True)  # no two halves
    assert not tconv.on_cudnn(x, w, b, *geometry)  # a CPU convolution: ATen adds the bias elsewhere
    assert not tconv.can_use(x, w, b, *geometry)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_silu_of_the_widened_gate_cast_back_is_a_silu_mul(dtype):
    """diffusers' FP32SiLU (Lumina's feed-forward): ``silu(a.float()).to(a.dtype) * b`` is one
    site (ATen's half-precision SiLU is that fp32 arithmetic, rounded once); cast back to another
    dtype, it is not."""
    a, b = torch.randn(2, 5, 16).to(dtype), torch.randn(2, 5, 16).to(dtype)

    def wide(a, b):
        return F.silu(a.float()).to(a.dtype) * b

    run, gm, result = rewrite(wide, (a, b), families=["activation"])
    assert result.counts["activation"] == 1, str(result)
    assert bits_equal(run(a, b), wide(a, b))

    def elsewhere(a, b):
        return F.silu(a.float()).to(torch.float16 if dtype == torch.bfloat16 else torch.bfloat16) * b.float()

    run, gm, result = rewrite(elsewhere, (a, b), families=["activation"])
    assert result.counts["activation"] == 0, str(result)
    assert bits_equal(run(a, b), elsewhere(a, b))
