"""attention_int8's Triton kernels under the interpreter: the smoothed keys' int8 blocks and scales
are the reference's bits (the interpreter's fp32 division is IEEE's and the rounding is floor and
ceil), and the attention stays within P's rounding to bf16 of the reference's fp32 softmax. With
``P @ v`` in e4m3: the smoothed values' e4m3 copy and scales are the reference's bits (the
interpreter's e4m3 cast, pre-rounded on the e4m3 grid by ``to_e4m3``), and the attention stays
within P's rounding to e4m3 of its reference."""
import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.attention_int8 import (K_BLOCK, attention_int8_fp8_values_reference, attention_int8_reference,  # noqa: E402
                                           quantize_blocks_reference, quantize_values_reference, smoothed_keys)
from sgdiff.kernels.layout import same_strides  # noqa: E402
from sgdiff.kernels.triton import attention_int8 as ai  # noqa: E402

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


def _qkv(b, h, s, s_k, d, heads_last=True, seed=0):
    """q, k shifted by 0.7, v with an offset per channel (what smoothing takes out)."""
    g = torch.Generator().manual_seed(seed)

    def make(n, shift=0.0):
        t = (torch.randn(b, n, h, d, generator=g) + shift).to(BF16)
        return t.transpose(1, 2) if heads_last else t.transpose(1, 2).contiguous()
    return make(s), make(s_k, shift=0.7), make(s_k, shift=2.0 * torch.randn(d, generator=g))


GEOMETRIES = [(1, 2, 200, 200, 64), (1, 1, 130, 130, 128), (2, 2, 64, 96, 32), (1, 1, 17, 300, 64)]


@pytest.mark.parametrize("b,h,s,s_k,d", GEOMETRIES)
def test_keys_and_attention_against_the_reference(b, h, s, s_k, d):
    q, k, v = _qkv(b, h, s, s_k, d)
    k8, scale = ai.quantize_keys(k)
    want8, want_scale = quantize_blocks_reference(smoothed_keys(k), K_BLOCK)
    assert torch.equal(scale.view(b, h, -1), want_scale)
    assert torch.equal(k8.view(b, h, -1, d)[:, :, :s_k], want8)
    assert not k8.view(b, h, -1, d)[:, :, s_k:].any()  # the padding rows are zeros
    want = attention_int8_reference(q, k, v, False, None)
    assert torch.equal(ai.attention_int8(q, k, v, False, None), ai._launcher(ai.CONFIGS[d][0])(q, k, v, False, None))
    for config in [c for c in ai.CONFIGS[d] if not c.fp8_values]:  # pointer loads and TMA
        got = ai._launcher(config)(q, k, v, False, None)
        assert same_strides(got.shape, got.stride(), want.stride())
        assert float((got.float() - want.float()).abs().max()) <= 2 ** -6 * max(1.0, float(want.float().abs().max()))


@pytest.mark.parametrize("b,h,s,s_k,d", GEOMETRIES)
def test_fp8_values_and_attention_against_the_reference(b, h, s, s_k, d):
    q, k, v = _qkv(b, h, s, s_k, d)
    vt, mean, scale = ai.quantize_values(v)
    want8, want_mean, want_scale = quantize_values_reference(v)
    assert torch.equal(mean.view(b, h, d), want_mean.view(b, h, d)) and torch.equal(scale.view(b, h, d), want_scale)
    values = vt.view(b, h, d, -1)
    assert torch.equal(values[..., :s_k].transpose(-1, -2).float(), want8.float())
    assert not values[..., s_k:].float().any()  # the padding columns are zeros
    want = attention_int8_fp8_values_reference(q, k, v, None).float()
    for config in [c for c in ai.CONFIGS[d] if c.fp8_values]:
        got = ai._launcher(config)(q, k, v, False, None)
        assert same_strides(got.shape, got.stride(), want.stride())
        # P rounded to e4m3 (3 mantissa bits) moves each output by a share of the values' spread
        # around their mean (at most 2^-4 of it, far less where errors of many keys cancel)
        spread = float((v.float() - want_mean).abs().max())
        assert float((got.float() - want).abs().max()) <= 2 ** -6 * spread + 2 ** -8 * float(want.abs().max())


def test_heads_first_inputs_and_an_explicit_scale():
    q, k, v = _qkv(1, 2, 70, 70, 64, heads_last=False)
    got = ai.attention_int8(q, k, v, False, 0.3)
    want = attention_int8_reference(q, k, v, False, 0.3)
    assert same_strides(got.shape, got.stride(), want.stride())
    assert float((got.float() - want.float()).abs().max()) <= 2 ** -6 * max(1.0, float(want.float().abs().max()))


def test_what_the_kernel_refuses():
    q, k, v = _qkv(1, 2, 64, 64, 64)
    assert ai.supported_layout(q, k, v, False, None)
    assert not ai.supported_layout(q, k, v, True, None)  # causal
    q96, k96, v96 = _qkv(1, 2, 64, 64, 96)
    assert not ai.supported_layout(q96, k96, v96, False, None)  # head dim
    assert not ai.supported_layout(q, k[:, :1], v[:, :1], False, None)  # grouped-query
    assert not ai.supported_layout(q.float(), k.float(), v.float(), False, None)  # fp32
