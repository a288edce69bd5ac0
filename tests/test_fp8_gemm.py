"""Family fp8_gemm and op linear_fp8 on the CPU: sites only at ``high``, exact site counts, the
quantization's contract, near misses left alone, all-or-nothing per graph; on a Flux of real
block structure, the output within FP8's error of eager's and equal to the op's fp32 math.
(The Triton quantization's bits and the GEMM on the GPU: tests/gpu/test_fp8_gpu.py.)"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels.gelu_linear_fp8 import gelu_linear_fp8_reference
from sgdiff.kernels.linear_fp8 import E4M3_MAX, linear_fp8_reference, quantize_rows_reference
from sgdiff.patterns import fp8_gemm
from tests.capture import rewrite
from tests.helpers import count_op

BF16 = torch.bfloat16
LINEAR_FP8 = torch.ops.sgdiff.linear_fp8.default
GELU_LINEAR_FP8 = torch.ops.sgdiff.gelu_linear_fp8.default


@pytest.fixture
def every_size(monkeypatch):
    """Small test shapes count as large GEMMs."""
    monkeypatch.setattr(fp8_gemm, "MIN_FLOP", 0)


def _w(n, k):
    return torch.randn(n, k, dtype=BF16) / k ** 0.5


def _linear(x, w, b):
    return F.linear(x, w, b)


def _args(m=64, k=128, n=96, bias=True, batch=(2,)):
    return torch.randn(*batch, m, k, dtype=BF16), _w(n, k), (torch.randn(n, dtype=BF16) if bias else None)


def _rel_err(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("tier,sites", [("lossless", 0), ("extra-high", 0), ("high", 1)])
def test_only_high_admits_it(every_size, tier, sites):
    args = _args()
    run, gm, result = rewrite(_linear, args, quality=tier, families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == sites and count_op(gm, LINEAR_FP8) == sites
    assert result.passes["fp8_gemm"].found_count == 1
    if not sites:
        assert [s.reason for s in result.skipped] == [
            f"contract approx is not admitted at {tier} (its numerics are not eager's bit for bit; "
            "quality='high' admits it)"]
        assert torch.equal(run(*args), _linear(*args))


@pytest.mark.parametrize("bias", [True, False])
def test_the_rewrite_computes_the_ops_math_within_fp8s_error_of_eager(every_size, bias):
    x, w, b = _args(bias=bias)
    args = (x, w, b) if bias else (x, w)
    run, gm, result = rewrite(lambda x, w, b=None: F.linear(x, w, b), args, quality="high", families=["fp8_gemm"])
    got = run(*args)
    assert result.counts["fp8_gemm"] == 1
    assert torch.equal(got, linear_fp8_reference(x, w, b).view(*x.shape[:-1], -1))
    assert _rel_err(got, _linear(x, w, b)) < 0.08  # two operands each off by up to 2^-4 relative, mostly far less


def test_q_k_v_of_one_input_read_that_input(every_size):
    """Three projections of one tensor: each op takes one tensor (x, or its one view to rows:
    the same view taken for each projection is one node), so they merge into one GEMM over x."""
    def qkv(x, wq, wk, wv):
        return F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)

    args = (torch.randn(1, 64, 128, dtype=BF16), _w(128, 128), _w(128, 128), _w(128, 128))
    run, gm, result = rewrite(qkv, args, quality="high", families=["fp8_gemm"])
    (call,) = [n for n in gm.graph.nodes if n.target is torch.ops.sgdiff.linear_fp8_siblings.default]
    assert result.counts["fp8_gemm"] == 3 and count_op(gm, LINEAR_FP8) == 0  # the three: one GEMM (test_fp8_siblings)
    x = call.args[0]
    assert x.op == "placeholder" or (x.target is torch.ops.aten.view.default and x.args[0].op == "placeholder")


@pytest.mark.parametrize("case", ["fp16", "fp32", "computed weight", "k not a multiple of 16",
                                  "n not a multiple of 16"])
def test_linear_layers_the_fp8_gemm_does_not_take_are_not_sites(every_size, case):
    x, w, b = _args()
    fn = (lambda x, w, b: F.linear(x, w * 2, b)) if case == "computed weight" else _linear
    if case == "fp16":
        x, w, b = x.half(), w.half(), b.half()
    elif case == "fp32":
        x, w, b = x.float(), w.float(), b.float()
    elif case == "k not a multiple of 16":
        x, w = x[..., :120].contiguous(), w[:, :120].contiguous()
    else:
        w, b = w[:90].contiguous(), b[:90].contiguous()
    run, gm, result = rewrite(fn, (x, w, b), quality="high", families=["fp8_gemm"])
    assert result.passes["fp8_gemm"].found_count == 0 and not result.skipped
    assert torch.equal(run(x, w, b), fn(x, w, b))


def test_small_gemms_are_not_sites_but_gemvs_over_large_weights_are(monkeypatch):
    """At the default MIN_FLOP, with MIN_WEIGHT_BYTES scaled down to 2 MiB: a one-row GEMM over a
    small weight (an adaLN projection of a narrow model) is not a site, nor one over a weight just
    under the bound; one over a weight of the bound (an adaLN projection of a wide model: its time
    is its weight's bytes) is, and so is a Flux-sized projection."""
    monkeypatch.setattr(fp8_gemm, "MIN_WEIGHT_BYTES", 2 ** 21)

    def fn(emb, wide, x, w_ada, w_under, w_wide, w):
        return F.linear(emb, w_ada), F.linear(wide, w_under), F.linear(wide, w_wide), F.linear(x, w)

    args = (torch.randn(1, 256, dtype=BF16), torch.randn(1, 1024, dtype=BF16), torch.randn(1, 4096, 1024, dtype=BF16),
            _w(1536, 256), _w(1008, 1024), _w(1024, 1024), _w(1024, 1024))
    run, gm, result = rewrite(fn, args, quality="high", families=["fp8_gemm"])
    assert 2 * 4096 * 1024 * 1024 >= fp8_gemm.MIN_FLOP > 2 * 1 * 1024 * 1024
    assert 1008 * 1024 * 2 < fp8_gemm.MIN_WEIGHT_BYTES == 1024 * 1024 * 2
    assert result.counts["fp8_gemm"] == 2 and result.passes["fp8_gemm"].found_count == 2
    assert count_op(gm, LINEAR_FP8) == 2
    got = run(*args)
    assert torch.equal(got[0], F.linear(args[0], args[3])) and torch.equal(got[1], F.linear(args[1], args[4]))
    assert torch.equal(got[2], linear_fp8_reference(args[1], args[5], None))


def test_one_failed_guard_keeps_every_site_of_the_graph_eager(every_size):
    """A GEMM over a transposed (non-contiguous) input fails the guard: the graph's other, valid
    site stays eager too (approx rewrites are all-or-nothing per graph and family)."""
    def fn(a, x, w):
        return torch.mm(a.t(), w.t()), F.linear(x, w)

    args = (torch.randn(128, 64, dtype=BF16), torch.randn(64, 128, dtype=BF16), _w(96, 128))
    run, gm, result = rewrite(fn, args, quality="high", families=["fp8_gemm"])
    reasons = sorted(s.reason for s in result.skipped)
    assert result.counts["fp8_gemm"] == 0 and count_op(gm, LINEAR_FP8) == 0
    assert reasons == ["another site of this family failed its guard (approx rewrites are all-or-nothing)",
                       "the linear's input is not contiguous (its rows are quantized where they lie)"]
    assert all(torch.equal(g, w) for g, w in zip(run(*args), fn(*args)))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), k=st.sampled_from([16, 48, 128, 3072]), log_scale=st.floats(-20, 20),
       zero_row=st.booleans())
def test_quantized_rows_keep_fp8s_relative_error(rows, k, log_scale, zero_row):
    x = (torch.randn(rows, k) * 2.0 ** log_scale).to(BF16)
    if zero_row:
        x[0] = 0
    q, scale = quantize_rows_reference(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (rows, 1) and bool((scale > 0).all())
    qf = q.float()
    assert float(qf.abs().max()) <= E4M3_MAX
    back, xf = qf * scale, x.float()
    # e4m3: 3 mantissa bits (half an ulp is 2^-4 of the value), subnormals spaced 2^-9 of the scale
    assert bool(((back - xf).abs() <= torch.maximum(xf.abs() * 2 ** -4, scale * 2 ** -10) * 1.0001).all())
    amax = xf.abs().amax(1, keepdim=True)
    assert bool(((qf.abs().amax(1, keepdim=True) == E4M3_MAX) | (amax == 0)).all())  # each row's largest maps to 448


def test_flux_at_high_takes_its_large_projections_and_stays_near_eager(monkeypatch):
    """A Flux of 2 double and 4 single blocks, width 256, 1024 image and 64 text tokens, with
    MIN_FLOP scaled down to 2^24: the sites are each double block's image-stream q, k, v, output
    and feed-forward projections (6, 134M-537M FLOP) and its text stream's feed-forward (2, 34M),
    each single block's q, k, v, proj_mlp and proj_out (5): 2 x 8 + 4 x 5 = 36. Not sites: the
    text stream's attention projections (8.4M), the embedders and the final projection (8.4M),
    adaLN's one-row GEMMs. The step's output stays within FP8's error of eager's."""
    import sgdiff
    from sgdiff import zoo

    monkeypatch.setattr(fp8_gemm, "MIN_FLOP", 2 ** 24)
    model, kw = zoo.build("flux", size="small", dtype=BF16)
    with torch.no_grad():
        want = model(**kw)[0]
        lossless = sgdiff.explain(model, **kw)
        high = sgdiff.explain(model, quality="high", **kw)
        got = torch.compile(model, backend="sgdiff", options={"quality": "high"})(**kw)[0]
    assert lossless.counts["fp8_gemm"] == 0
    assert high.counts["fp8_gemm"] == high.found["fp8_gemm"] == 36
    # of which the GEMMs over a GELU: each double block's two feed-forward down projections, each single
    # block's proj_out over the cat
    assert high.family_ops["fp8_gemm"] == {"gelu_linear_fp8": 2 * 2 + 4, "linear_fp8": 36 - 8}
    assert not [s for s in high.skipped if s[0] == "fp8_gemm"]
    # each double block's image q, k, v and each single block's q, k, v and proj_mlp: one GEMM a block
    assert high.merged_projections == 2 + 4 and lossless.merged_projections == 0
    # the LayerNorm-modulates read only by them: each double block's image norm1 (q, k, v) and norm2 (ff up) and
    # text norm2 (ff up; its q, k, v are no sites), each single block's norm: their rows made by the norm's kernel
    assert high.folded_norms == 2 * 3 + 4 and lossless.folded_norms == 0
    assert 0 < _rel_err(got, want) < 0.1


def _map(c=64, h=4, w=8, channels_last=True):
    x = torch.randn(2, h, w, c, dtype=BF16).permute(0, 3, 1, 2)  # a token stream viewed as a map
    return x if channels_last else x.contiguous()


@pytest.mark.parametrize("bias", [True, False])
def test_a_pointwise_convolution_of_a_channels_last_map_is_an_fp8_gemm(every_size, bias):
    from sgdiff.kernels.pointwise_conv_fp8 import pointwise_conv_fp8_reference

    x, w = _map(), _w(96, 64).view(96, 64, 1, 1)
    b = torch.randn(96, dtype=BF16) if bias else None
    args = (x, w, b) if bias else (x, w)
    run, gm, result = rewrite(lambda x, w, b=None: F.conv2d(x, w, b), args, quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 1 and count_op(gm, torch.ops.sgdiff.pointwise_conv_fp8.default) == 1
    got, eager = run(*args), F.conv2d(x, w, b)
    assert got.stride() == eager.stride()  # channels-last, as eager's
    assert torch.equal(got, pointwise_conv_fp8_reference(x, w, b))
    assert _rel_err(got, eager) < 0.08


@pytest.mark.parametrize("case", ["contiguous map", "3x3", "stride 2", "two groups", "fp16"])
def test_convolutions_the_fp8_gemm_does_not_take_are_not_sites(every_size, case):
    x, w, kw = _map(), _w(96, 64).view(96, 64, 1, 1), {}
    if case == "contiguous map":
        x = _map(channels_last=False)
    elif case == "3x3":
        w, kw = torch.randn(96, 64, 3, 3, dtype=BF16) / 24, dict(padding=1)
    elif case == "stride 2":
        kw = dict(stride=2)
    elif case == "two groups":
        w, kw = w[:, :32].contiguous(), dict(groups=2)
    else:
        x, w = x.half(), w.half()
    run, gm, result = rewrite(lambda x, w: F.conv2d(x, w, **kw), (x, w), quality="high", families=["fp8_gemm"])
    assert result.passes["fp8_gemm"].found_count == 0 and not result.skipped
    assert torch.equal(run(x, w), F.conv2d(x, w, **kw))


def test_sana_at_high_takes_its_projections_and_its_glumbconv(every_size):
    """Sana (tiny: one block, width 16), every GEMM large enough: 12 sites, the timestep embedder's
    two linears and adaLN's, the caption projection's two, self-attention's q, k and v,
    cross-attention's k, v and output, and GLUMBConv's inverted 1x1 convolution. Not sites: the
    two projections that read the transposed token stream (self-attention's output, cross-attention's
    q: F.linear traces them as a bmm), GLUMBConv's point convolution (40 channels, not a multiple
    of 16), the patch embedding's convolution (a contiguous map of 4 channels)."""
    import sgdiff
    from sgdiff import zoo

    model, kw = zoo.build("sana", "tiny", dtype=BF16)
    with torch.no_grad():
        report = sgdiff.explain(model, quality="high", **kw)
    assert report.counts["fp8_gemm"] == report.found["fp8_gemm"] == 12


def _feed_forward(x, w1, b1, w2, b2=None):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def _single_block_out(attn, x, w1, w2, b2):
    """Flux single blocks: ``proj_out(cat([attn_output, gelu(proj_mlp(x))], dim=2))``."""
    return F.linear(torch.cat([attn, F.gelu(F.linear(x, w1), approximate="tanh")], dim=2), w2, b2)


def _sdpa_out(b=1, h=2, s=64, d=64):
    """SDPA's output as attention processors lay it out: ``[B, S, H D]``, a view of ``[B, H, S, D]``."""
    return torch.randn(b, h, s, d, dtype=BF16).transpose(1, 2).flatten(2, 3)


@pytest.mark.parametrize("bias", [True, False])
def test_a_down_projection_takes_its_gelu_and_quantizes_it_in_the_same_pass(every_size, bias):
    x, w1, b1 = _args(k=128, n=256)
    args = (x, w1, b1, _w(96, 256)) + ((torch.randn(96, dtype=BF16),) if bias else ())
    run, gm, result = rewrite(_feed_forward, args, quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 2 and count_op(gm, GELU_LINEAR_FP8) == 1 and count_op(gm, LINEAR_FP8) == 1
    assert count_op(gm, torch.ops.aten.gelu.default) == 0
    up = linear_fp8_reference(x, w1, b1).view(2, 64, 256)
    got = run(*args)
    assert torch.equal(got, gelu_linear_fp8_reference(up, args[3], args[4] if bias else None).view(2, 64, 96))
    assert _rel_err(got, _feed_forward(*args)) < 0.1


def test_a_single_blocks_proj_out_takes_the_cat_and_its_gelu(every_size):
    args = (_sdpa_out(), torch.randn(1, 64, 128, dtype=BF16), _w(256, 128), _w(96, 384), torch.randn(96, dtype=BF16))
    run, gm, result = rewrite(_single_block_out, args, quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 2 and count_op(gm, GELU_LINEAR_FP8) == 1
    assert count_op(gm, torch.ops.aten.cat.default) == 0
    call = next(n for n in gm.graph.nodes if n.target is GELU_LINEAR_FP8)
    head = call.kwargs["head"] if "head" in call.kwargs else call.args[3]
    assert head.meta["val"].stride() == args[0].stride()  # SDPA's layout, read where it lies
    got = run(*args)
    mlp = linear_fp8_reference(args[1], args[2], None).view(1, 64, 256)
    assert torch.equal(got, gelu_linear_fp8_reference(mlp, args[3], args[4], head=args[0]).view(1, 64, 96))
    assert _rel_err(got, _single_block_out(*args)) < 0.1


def test_the_fast_gelu_is_atens_gelu_within_one_bf16_rounding():
    """gelu_linear_fp8's GELU form, x / (1 + 2^(-2u log2 e)), at every finite bf16 value: within
    one bf16 rounding of the exact function (float64; below 2^-120, near fp32 denormals, zero), and against ATen's 0.5 x (1 + tanh(u)) at
    most one bf16 ulp apart where ATen's form is itself that close (|gelu| >= 2^-12: below, its
    1 + tanh cancels), equal at all but a small share; x itself for large x."""
    from sgdiff.kernels.gelu_linear_fp8 import gelu_tanh_fast
    from tests.helpers import every_16bit_value

    x = every_16bit_value(BF16, device="cpu")
    x = x[torch.isfinite(x)]
    got, want = gelu_tanh_fast(x), F.gelu(x, approximate="tanh")
    assert got.dtype == BF16
    xd = x.double()
    exact = xd * torch.sigmoid(2 * 0.7978845608028654 * (xd + 0.044715 * xd ** 3))  # 0.5 (1 + tanh u) = sigma(2u)
    assert bool(((got.double() - exact).abs() <= exact.abs() * 2 ** -8 + 2 ** -120).all())
    apart = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    resolved = want.float().abs() >= 2 ** -12
    assert bool((apart[resolved] <= 1).all()), int(apart[resolved].max())
    assert float((apart[resolved] != 0).float().mean()) < 1e-3
    big = x.float() > 10
    assert torch.equal(got[big], x[big])


@pytest.mark.parametrize("case", ["the GELU read twice", "an exact GELU", "a cat along the tokens"])
def test_gelus_the_fused_gemm_does_not_take_leave_it_the_plain_fp8_gemm(every_size, case):
    """Not sites of gelu_linear_fp8, and no skip either: the GEMM stays linear_fp8's, over the
    GELU's (or the cat's) output as eager makes it."""
    x, w, b = _args(k=128, n=96)
    if case == "the GELU read twice":
        def fn(x, w, b):
            g = F.gelu(x, approximate="tanh")
            return F.linear(g, w, b), g
    elif case == "an exact GELU":
        def fn(x, w, b):
            return F.linear(F.gelu(x), w, b)
    else:
        def fn(x, w, b):
            return F.linear(torch.cat([x, F.gelu(x, approximate="tanh")], dim=1), w, b)
    run, gm, result = rewrite(fn, (x, w, b), quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 1 and count_op(gm, LINEAR_FP8) == 1 and count_op(gm, GELU_LINEAR_FP8) == 0
    assert not result.skipped
