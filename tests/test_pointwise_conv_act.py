"""pointwise_conv_act: a biased 1x1 convolution of a channels-last map and its SiLU / GELU as the
GEMM over the map's tokens (``close``: cuBLAS's sums, not cuDNN's) — the pattern's sites, its
near misses, the tiers that admit it, the op against its reference and against eager."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import registry
from sgdiff.kernels.layout import map_tokens, tokens_map, weight_rows
from sgdiff.kernels.pointwise_conv_act import pointwise_conv_act_reference
from tests.capture import rewrite
from tests.helpers import bits_equal, count_op, not_admitted

POINTWISE = registry.op_def("pointwise_conv_act").load()
CONV_SILU = registry.op_def("conv_silu").load()
CONV_SILU_MUL = registry.op_def("conv_silu_mul").load()
aten = torch.ops.aten
HALF = [torch.bfloat16, torch.float16]


def glumbconv(C, ratio, dtype, seed=0):
    """diffusers' GLUMBConv (Sana's feed-forward), random weights."""
    from diffusers.models.transformers.sana_transformer import GLUMBConv

    torch.manual_seed(seed)
    return GLUMBConv(C, C, expand_ratio=ratio).to(dtype).eval()


def sana_feed_forward(ff, H, W):
    """The module as Sana's block calls it: tokens unflattened to a channels-last map, parameters
    as graph inputs (as torch.compile lifts them)."""
    names = [name for name, _ in ff.named_parameters()]

    def fn(tokens, *params):
        return torch.func.functional_call(ff, dict(zip(names, params)), (tokens.unflatten(1, (H, W)).permute(0, 3, 1, 2),))

    return fn


def close_to_eager(got, want):
    """Within what moving one rounding and the sums' order gives: 2 ulps of the output's scale."""
    scale = want.float().abs().amax().clamp_min(1e-3)
    return bool(((got.float() - want.float()).abs() <= 2 * torch.finfo(want.dtype).eps * scale).all())


@settings(deadline=None, max_examples=12)
@given(C=st.sampled_from([8, 16]), ratio=st.sampled_from([1, 2.5]), B=st.integers(1, 2), H=st.integers(1, 5),
       W=st.integers(1, 6), dtype=st.sampled_from(HALF))
def test_glumbconv_inverted_is_the_gemm_at_extra_high(C, ratio, B, H, W, dtype):
    ff = glumbconv(C, ratio, dtype)
    fn = sana_feed_forward(ff, H, W)
    args = (torch.randn(B, H * W, C).to(dtype), *(p.detach() for p in ff.parameters()))
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert result.counts["activation"] == 2 and not result.skipped, result.skipped
    assert count_op(gm, POINTWISE) == 1 and count_op(gm, CONV_SILU) == 0 and count_op(gm, CONV_SILU_MUL) == 1
    assert sum(t == aten.convolution.default for t in (n.target for n in gm.graph.nodes)) == 1  # conv_point's own
    with torch.no_grad():
        got, want = run(*args), fn(*args)
    assert got.stride() == want.stride() and close_to_eager(got, want)


def test_lossless_keeps_the_convolution_and_says_why():
    ff = glumbconv(8, 2.5, torch.bfloat16)
    fn = sana_feed_forward(ff, 3, 4)
    args = (torch.randn(2, 12, 8).bfloat16(), *(p.detach() for p in ff.parameters()))
    run, gm, result = rewrite(fn, args, families=["activation"])
    assert count_op(gm, POINTWISE) == 0 and count_op(gm, CONV_SILU) == 1 and result.counts["activation"] == 2
    assert [s.op for s in result.skipped] == ["pointwise_conv_act"] and not_admitted(result.skipped[0].reason)
    with torch.no_grad():
        assert bits_equal(run(*args), fn(*args))


def _map(C=16, N=32, dtype=torch.bfloat16, channels_last=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, C, 3, 5, generator=g).to(dtype)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    return x, (torch.randn(N, C, 1, 1, generator=g) * C ** -0.5).to(dtype), torch.randn(N, generator=g).to(dtype)


@pytest.mark.parametrize("name,fn,act", [
    ("SiLU", lambda x, w, b: F.silu(F.conv2d(x, w, b)), "silu"),
    ("GELU", lambda x, w, b: F.gelu(F.conv2d(x, w, b)), "gelu"),
    ("GELU-tanh", lambda x, w, b: F.gelu(F.conv2d(x, w, b), approximate="tanh"), "gelu_tanh"),
])
def test_each_activation_is_a_site(name, fn, act):
    args = _map()
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert count_op(gm, POINTWISE) == 1 and result.counts["activation"] == 1, name
    node = next(n for n in gm.graph.nodes if n.target == POINTWISE)
    assert node.args[3] == act, name
    got = run(*args)
    assert bits_equal(got, pointwise_conv_act_reference(*args, act)) and close_to_eager(got, fn(*args)), name


@pytest.mark.parametrize("name,fn,channels_last,conv_silu", [
    ("a 3x3 convolution", lambda x, w, b: F.silu(F.conv2d(x, w.expand(-1, -1, 3, 3).contiguous(), b, padding=1)),
     True, 1),
    ("stride 2", lambda x, w, b: F.silu(F.conv2d(x, w, b, stride=2)), True, 1),
    ("two groups", lambda x, w, b: F.silu(F.conv2d(x, w[:, :8].contiguous(), b, groups=2)), True, 1),
    ("padding 1", lambda x, w, b: F.silu(F.conv2d(x, w, b, padding=1)), True, 1),
    ("a contiguous (NCHW) map", lambda x, w, b: F.silu(F.conv2d(x, w, b)), False, 1),
    ("no bias", lambda x, w, b: F.silu(F.conv2d(x, w)), True, 0),
    ("sigmoid, not SiLU", lambda x, w, b: torch.sigmoid(F.conv2d(x, w, b)), True, 0),
])
def test_near_misses_are_not_pointwise_sites(name, fn, channels_last, conv_silu):
    args = _map(channels_last=channels_last)
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert count_op(gm, POINTWISE) == 0, name
    assert count_op(gm, CONV_SILU) == conv_silu, name
    assert bits_equal(run(*args), fn(*args)), name


def test_convolution_with_another_user_is_skipped():
    def fn(x, w, b):
        y = F.conv2d(x, w, b)
        return F.silu(y), y

    args = _map()
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert count_op(gm, POINTWISE) == 0 and result.counts["activation"] == 0
    assert any("another user" in s.reason for s in result.skipped), result.skipped


def test_float32_is_not_a_site():
    args = _map(dtype=torch.float32)
    fn = lambda x, w, b: F.silu(F.conv2d(x, w, b))  # noqa: E731
    run, gm, result = rewrite(fn, args, quality="extra-high", families=["activation"])
    assert count_op(gm, POINTWISE) == 0 and count_op(gm, CONV_SILU) == 1


def test_cuda_keeps_eagers_convolution_unless_the_gemm_is_faster(monkeypatch):
    """On CUDA the op runs eager's convolution path or the GEMM over the tokens, whichever first
    sight times faster, the convolution first (kept within the margin); each path's bits: the
    convolution's eager's own, the GEMM's the reference's."""
    from sgdiff.kernels import conv_as_gemm, tuning

    assert [label for label, _ in conv_as_gemm.CANDIDATES] == ["convolution", "gemm"]
    x, w, b = _map()
    for act, fn in (("silu", F.silu), ("gelu", F.gelu)):
        conv, gemm = (dict(conv_as_gemm.CANDIDATES)[k](x, w, b, act) for k in ("convolution", "gemm"))
        assert bits_equal(conv, fn(F.conv2d(x, w, b))) and conv.stride() == fn(F.conv2d(x, w, b)).stride()
        assert bits_equal(gemm, pointwise_conv_act_reference(x, w, b, act)) and gemm.stride() == conv.stride()
    # first sight's choice: the given times decide, the convolution kept within the margin
    for times, chosen in (([1.0, 0.9], "gemm"), ([1.0, 0.99], "convolution"), ([1.0, 1.5], "convolution")):
        sight = tuning.FirstSight("pointwise_conv_act")
        monkeypatch.setattr(conv_as_gemm, "FIRST_SIGHT", sight)
        monkeypatch.setattr(tuning, "best_times", lambda candidates, args, t=times: t)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        assert conv_as_gemm.choose(x, w, b, "silu")[0] == chosen
        monkeypatch.undo()
    assert conv_as_gemm.supported_layout(x, w, b, "silu")
    assert not conv_as_gemm.supported_layout(x.contiguous(), w, b, "silu")  # tokens not rows
    assert not conv_as_gemm.supported_layout(x.float(), w.float(), b.float(), "silu")


def test_reference_is_the_linear_over_the_tokens():
    x, w, b = _map()
    y = pointwise_conv_act_reference(x, w, b, "gelu_tanh")
    want = tokens_map(F.gelu(F.linear(map_tokens(x), weight_rows(w), b), approximate="tanh"), x)
    assert bits_equal(y, want) and y.is_contiguous(memory_format=torch.channels_last)


def test_opcheck():
    x, w, b = _map()
    torch.library.opcheck(POINTWISE, (x, w, b, "silu"))
