"""sgdiff::attention_fp8 on the CPU: its math (cuDNN's FP8 attention as the op's reference computes
it) against exact attention, the operands' scales, the layouts the cuDNN implementation refuses,
and the cuDNN graph it defines, validated by the cuDNN frontend where that is installed (building
and running it needs a GPU: tests/gpu/test_attention_fp8_gpu.py)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels.attention import attention_reference
from sgdiff.kernels.attention_fp8 import (attention_fp8_reference, operand_scales, quantized_operands,
                                          takes_head_dim, tensor_scale)
from sgdiff.kernels.cudnn import attention_fp8 as cudnn_fp8

BF16 = torch.bfloat16


def _qkv(s, s_k, d, offset=0.0, spread=1.0, seed=0, h=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, s, d, generator=g).to(BF16)
    k = (torch.randn(1, h, s_k, d, generator=g) * spread + offset).to(BF16)
    v = (torch.randn(1, h, s_k, d, generator=g) + offset * torch.randn(d, generator=g)).to(BF16)
    return q, k, v


def _bound(q, k, v, causal) -> float:
    """What e4m3's 3 bits may cost: P's rounding and v's each up to 2^-4 of what a row weighs of v
    less its mean, ``P |v - mean(v)|``, plus 3% of the output (q's and k's roundings moving the
    scores); k's and v's offsets (taken out by the smoothing) cost nothing."""
    q, k, v = q.float(), k.float(), v.float()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    spread = torch.softmax(s, dim=-1) @ (v - v.mean(dim=2, keepdim=True)).abs()
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return 2 ** -3 * float(spread.norm()) + 0.03 * float(exact.norm())


@settings(max_examples=20, deadline=None)
@given(s=st.integers(1, 300), s_k=st.integers(1, 300), d=st.sampled_from([64, 128]), offset=st.floats(-4, 4),
       spread=st.floats(0.1, 3), causal=st.booleans())
def test_fp8_attention_math_stays_near_exact_attention(s, s_k, d, offset, spread, causal):
    """Within :func:`_bound` of exact attention. (A tenth of what attention adds to v's mean, the
    bound once here, is no bound where one query attends evenly: then it adds almost nothing,
    while P's rounding still moves the output by its share of v's spread.)"""
    s_k = s if causal else s_k
    q, k, v = _qkv(s, s_k, d, offset, spread, seed=s * 1000 + s_k)
    got = attention_fp8_reference(q, k, v, causal, None).float()
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert got.stride() == attention_reference(q, k, v, causal, None).stride()
    assert float((got - exact).norm()) <= _bound(q, k, v, causal)


def test_a_wrong_scale_is_far_from_exact_attention():
    """The bound above tells attention from a near miss: the scores at twice the scale."""
    q, k, v = _qkv(200, 200, 64, offset=1.0, spread=2.0)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    got = attention_fp8_reference(q, k, v, False, 2 / math.sqrt(64)).float()
    assert float((got - exact).norm()) > 2 * _bound(q, k, v, False)


def test_each_operand_reaches_e4m3s_largest_value():
    """q and smoothed k as a whole, v per channel of a head: each scale maps the largest magnitude
    to 448; the scales from ATen's aminmax equal the largest magnitude computed directly."""
    q, k, v = _qkv(150, 90, 64, offset=2.0, spread=1.5)
    q8, q_scale, k8, k_scale, v8, v_mean, v_scale = quantized_operands(q, k, v)
    assert float(q8.float().abs().max()) == 448.0 and float(k8.float().abs().max()) == 448.0
    assert bool((v8.float().abs().amax(dim=2) == 448.0).all())
    centre = (k.float().amax(dim=2, keepdim=True) + k.float().amin(dim=2, keepdim=True)) * 0.5
    smoothed = k.float() - centre
    assert torch.equal(k_scale, smoothed.abs().amax().clamp_min(1e-12) / torch.tensor(448.0))
    # k around the centre of each channel's range: its largest and smallest values land at +-448
    # alike where the channel's range is the widest
    widest = (k.float().amax(dim=2) - k.float().amin(dim=2)).flatten().argmax()
    k8c = k8.float().transpose(2, 3).flatten(0, 2)[widest]
    assert float(k8c.max()) >= 416.0 and float(k8c.min()) <= -416.0
    assert torch.equal(q_scale, q.float().abs().amax() / torch.tensor(448.0))
    assert torch.equal(tensor_scale(torch.zeros(3, 4)), torch.tensor(1e-12) / torch.tensor(448.0))
    assert operand_scales(q, k, v)[2].dim() == 0 and v_scale.shape == (1, 2, 64)


def test_head_dims_and_layouts_the_cudnn_implementation_refuses():
    q, k, v = _qkv(64, 64, 64)
    assert [takes_head_dim(d) for d in (16, 40, 64, 128, 256, 272)] == [True, False, True, True, True, False]
    refused = [
        (q.float(), k.float(), v.float()),  # fp32
        (q, k[..., :32], v[..., :32]),  # another head dim
        (q, k[:, :1], v[:, :1]),  # grouped-query heads
        (q, k, v[:, :, :32]),  # k and v of other token counts
        (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v),  # not unit-strided along D
        (q[..., :40], k[..., :40], v[..., :40]),  # a head dim cuDNN does not take
    ]
    for args in refused:
        assert not cudnn_fp8.supported_layout(*args, False, None)
    assert cudnn_fp8.supported_layout(q, k, v, False, None) == cudnn_fp8.available()


@pytest.mark.parametrize("b,h,s_q,s_k,d,causal", [(1, 24, 4608, 4608, 128, False), (1, 12, 32760, 512, 128, False),
                                                  (2, 4, 300, 300, 64, True)])
def test_the_cudnn_graph_validates(b, h, s_q, s_k, d, causal):
    """The graph of Flux's joint attention, Wan's cross-attention and a causal one: FP8 q, k, v and
    output in [B, S, H, D] memory seen heads-first, six fp32 scalars, both amax outputs."""
    cudnn = pytest.importorskip("cudnn")
    graph, tensors = cudnn_fp8.define_graph(cudnn, b, h, s_q, s_k, d, causal, 1 / math.sqrt(d))
    assert set(tensors) == {"q", "k", "v", "o", "amax_s", "amax_o", *cudnn_fp8.SCALARS}
    for name, s in (("q", s_q), ("k", s_k), ("v", s_k), ("o", s_q)):
        assert (tuple(tensors[name].get_dim()), tuple(tensors[name].get_stride())) == cudnn_fp8.heads_dims(b, h, s, d)
        assert tensors[name].get_data_type() == cudnn.data_type.FP8_E4M3
    for name in cudnn_fp8.SCALARS:
        assert tuple(tensors[name].get_dim()) == (1, 1, 1, 1)
    assert "seq_len_q" not in tensors


def test_the_padded_cudnn_graph_validates():
    """Wan's self-attention, 32760 tokens, as cuDNN's FP8 kernels may take it only: 32768 tokens,
    the last 8 masked out by the true counts."""
    cudnn = pytest.importorskip("cudnn")
    assert [cudnn_fp8.padded(s) for s in (1, 128, 129, 32760)] == [128, 128, 256, 32768]
    graph, tensors = cudnn_fp8.define_graph(cudnn, 1, 12, 32760, 32760, 128, False, 1 / math.sqrt(128), pad=True)
    for name in ("q", "k", "v", "o"):
        assert tuple(tensors[name].get_dim()) == (1, 12, 32768, 128)
    for name in ("seq_len_q", "seq_len_kv"):
        assert tuple(tensors[name].get_dim()) == (1, 1, 1, 1) and tensors[name].get_data_type() == cudnn.data_type.INT32
