"""Families attention (``close``, extra-high) and int8_attention (``approx``, high) on the CPU: which
tier takes which site, exact site counts, what is not a site (a mask, another output layout), the
INT8 kernel's limits sending every site of a graph to the lower tier's op, and the INT8 op's math
against exact attention. (The kernels' speed and error on the GPU: tests/gpu/test_attention_gpu.py.)"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels.attention import attention_reference
from sgdiff.kernels.attention_int8 import (K_BLOCK, attention_int8_fp8_values_reference, attention_int8_reference,
                                           quantize_blocks_reference, quantize_values_reference)
from tests.capture import rewrite
from tests.helpers import count_op

BF16 = torch.bfloat16
ATTENTION = torch.ops.sgdiff.attention.default
ATTENTION_INT8 = torch.ops.sgdiff.attention_int8.default
FAMILIES = ["attention", "int8_attention"]


def _heads(x):
    return x.transpose(1, 2)  # [B, S, H, D] -> [B, H, S, D], as diffusers hands q, k, v to SDPA


def attend(q, k, v):
    return _heads(F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v))).flatten(2)


def _qkv(s=96, h=2, d=64, s_k=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, h, d, generator=g).to(BF16) for n in (s, s_k or s, s_k or s))


@pytest.mark.parametrize("tier,op", [("lossless", None), ("extra-high", ATTENTION), ("high", ATTENTION_INT8)])
def test_each_tier_takes_its_op(tier, op):
    args = _qkv()
    run, gm, result = rewrite(attend, args, quality=tier, families=FAMILIES)
    assert count_op(gm, ATTENTION) == (op is ATTENTION) and count_op(gm, ATTENTION_INT8) == (op is ATTENTION_INT8)
    assert sum(result.counts.values()) == (op is not None)
    assert not any(n.target == torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
                   for n in gm.graph.nodes) or op is None  # the replaced kernel is not left running
    got, want = run(*args), attend(*args)
    if op is ATTENTION_INT8:
        q, k, v = (_heads(t) for t in args)
        assert torch.equal(got, _heads(attention_int8_reference(q, k, v, False, None)).flatten(2))
    else:
        assert torch.equal(got, want)  # the CPU's attention kernel is eager's own


@pytest.mark.parametrize("case", ["mask", "heads-first output", "dropout"])
def test_attention_the_ops_do_not_take_is_not_a_site(case):
    q, k, v = _qkv()
    if case == "mask":
        def fn(q, k, v):
            mask = torch.ones(96, 96, dtype=torch.bool).tril()
            return F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), attn_mask=mask)
    elif case == "heads-first output":  # q [B, H, S, D] contiguous: the CPU kernel writes that order
        q, k, v = (_heads(t).contiguous() for t in (q, k, v))

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)
    else:
        def fn(q, k, v):
            return F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), dropout_p=0.5)
    if case == "dropout":
        torch.manual_seed(0)
    run, gm, result = rewrite(fn, (q, k, v), quality="high", families=FAMILIES)
    assert sum(r.found_count for r in result.passes.values()) == 0 and not result.skipped


def test_a_head_dim_the_int8_kernel_lacks_sends_every_site_of_the_graph_to_the_close_op():
    """Two attentions, head dims 64 and 96: at high the INT8 family takes neither (all-or-nothing per
    graph and family) and the attention family takes both."""
    a, b = _qkv(d=64), _qkv(d=96, seed=1)

    def two(q1, k1, v1, q2, k2, v2):
        return attend(q1, k1, v1), attend(q2, k2, v2)

    run, gm, result = rewrite(two, a + b, quality="high", families=FAMILIES)
    assert result.counts == {"int8_attention": 0, "attention": 2}
    assert sorted(s.reason for s in result.skipped) == [
        "another site of this family failed its guard (approx rewrites are all-or-nothing)",
        "head dim 96 (the INT8 kernel takes 32, 64, 128)"]
    assert all(torch.equal(g, w) for g, w in zip(run(*a, *b), two(*a, *b)))


def test_causal_attention_goes_to_the_close_op():
    def causal(q, k, v):
        return _heads(F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), is_causal=True)).flatten(2)

    args = _qkv()
    run, gm, result = rewrite(causal, args, quality="high", families=FAMILIES)
    assert result.counts == {"int8_attention": 0, "attention": 1}
    assert torch.equal(run(*args), causal(*args))


def test_grouped_query_attention_is_refused():
    q, k, v = _qkv()
    k, v = k[:, :, :1], v[:, :, :1]

    def gqa(q, k, v):
        return _heads(F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), enable_gqa=True)).flatten(2)

    run, gm, result = rewrite(gqa, (q, k, v), quality="extra-high", families=FAMILIES)
    assert result.counts["attention"] == 0
    assert [s.reason for s in result.skipped if s.family == "attention"] == [
        "q, k and v differ in head count or head dim (grouped-query attention)"]


@settings(max_examples=20, deadline=None)
@given(s=st.integers(1, 300), s_k=st.integers(1, 300), d=st.sampled_from([32, 64, 128]),
       offset=st.floats(-4, 4), spread=st.floats(0.1, 3))
def test_int8_attention_math_stays_near_exact_attention(s, s_k, d, offset, spread):
    """k's per-channel offset (which the smoothing takes out) changes nothing; the output stays
    within a few percent of exact attention."""
    g = torch.Generator().manual_seed(s * 1000 + s_k)
    q = torch.randn(1, 2, s, d, generator=g).to(BF16)
    k = (torch.randn(1, 2, s_k, d, generator=g) * spread + offset).to(BF16)
    v = torch.randn(1, 2, s_k, d, generator=g).to(BF16)
    got = attention_int8_reference(q, k, v, False, None).float()
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert got.stride() == attention_reference(q, k, v, False, None).stride()
    assert float((got - exact).norm() / exact.norm()) < 0.04


@settings(max_examples=20, deadline=None)
@given(s=st.integers(1, 300), s_k=st.integers(1, 300), d=st.sampled_from([32, 64, 128]),
       offset=st.floats(-4, 4), spread=st.floats(0.1, 3))
def test_fp8_values_math_stays_near_exact_attention(s, s_k, d, offset, spread):
    """With v in e4m3 per channel, v's per-channel offset (which the smoothing takes out) changes
    nothing: the output moves from the INT8 op's by at most v's rounding to e4m3 (2^-4 of the
    largest distance from the mean), and the e4m3 copy of each channel reaches 448 (its largest
    magnitude)."""
    g = torch.Generator().manual_seed(s * 1000 + s_k)
    q = torch.randn(1, 2, s, d, generator=g).to(BF16)
    k = torch.randn(1, 2, s_k, d, generator=g).to(BF16)
    v = (torch.randn(1, 2, s_k, d, generator=g) * spread + offset * torch.randn(d, generator=g)).to(BF16)
    got = attention_int8_fp8_values_reference(q, k, v, None).float()
    int8 = attention_int8_reference(q, k, v, False, None).float()
    assert got.stride() == int8.stride()
    v8, mean, _ = quantize_values_reference(v)
    spread = float((v.float() - mean).abs().max())
    assert float((got - int8).abs().max()) <= 2 ** -4 * spread + 2 ** -7 * float(int8.abs().max())
    peaks = v8.float().abs().amax(dim=2)
    assert bool(((peaks == 448.0) | (peaks == 0.0)).all())


def test_key_blocks_scale_to_int8s_largest_value():
    k = torch.randn(1, 1, 300, 64) * 3
    q8, scale = quantize_blocks_reference(k, K_BLOCK)
    assert q8.shape == k.shape and scale.shape == (1, 1, 3)
    for i in range(3):
        assert float(q8[0, 0, i * K_BLOCK:(i + 1) * K_BLOCK].float().abs().max()) == 127.0


def test_flux_at_extra_high_and_high():
    """A Flux of 2 double and 4 single blocks (head dim 64): 6 attention sites, each block's one;
    extra-high takes them with the close op (equal to eager on the CPU, whose kernel it is), high
    with the INT8 op."""
    import sgdiff
    from sgdiff import zoo

    model, kw = zoo.build("flux", size="small", dtype=BF16)
    with torch.no_grad():
        extra, high = (sgdiff.explain(model, quality=q, **kw) for q in ("extra-high", "high"))
    assert (extra.counts["attention"], extra.counts["int8_attention"]) == (6, 0)
    assert (high.counts["attention"], high.counts["int8_attention"]) == (0, 6)


@pytest.mark.parametrize("eager", ["cudnn", "flash", "efficient", None])
def test_the_close_op_times_eagers_own_kernel_first(monkeypatch, eager):
    """First sight keeps its first candidate unless another is faster by the margin: that one is the
    kernel eager's selector picks for the operands (cuDNN's on Hopper with torch 2.11), so a tie
    keeps eager's bits; where the selector names none of them the order stays as it is."""
    from sgdiff import _compat
    from sgdiff.kernels import sdpa

    monkeypatch.setattr(_compat, "sdpa_backend", lambda *args: eager)
    q, k, v = (_heads(t) for t in _qkv())
    order = [label for label, _ in sdpa.eager_first(q, k, v, False, None)]
    assert sorted(order) == sorted(label for label, _ in sdpa.CANDIDATES)
    assert order[0] == (eager or sdpa.CANDIDATES[0][0])
    assert order[1:] == [label for label, _ in sdpa.CANDIDATES if label != order[0]]


def test_eagers_selector_names_a_fused_kernel_or_none():
    from sgdiff import _compat

    q, k, v = (_heads(t) for t in _qkv())
    assert _compat.sdpa_backend(q, k, v, False, None) in ("flash", "efficient", "cudnn", None)
    assert _compat.sdpa_backend(q, k[..., :32], v, False, None) is None  # operands it refuses

