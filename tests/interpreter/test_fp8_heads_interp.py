"""attention_fp8's Triton kernels under the interpreter: the e4m3 copies of q, smoothed k and
smoothed v are the reference's bits (the interpreter's fp32 division is IEEE's, its e4m3 cast
pre-rounded on the e4m3 grid by ``to_e4m3``), in cuDNN's ``[B, S, H, D]`` order whatever q, k, v's
strides; the output's restoration is the reference's in fp32 (the interpreter does not contract
the product and the sum) and within its bf16 rounding (the interpreter truncates)."""
import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.attention_fp8 import quantized_operands, restore_values  # noqa: E402
from sgdiff.kernels.linear_fp8 import E4M3  # noqa: E402
from sgdiff.kernels.triton import fp8_heads  # noqa: E402

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


def _qkv(b, h, s, s_k, d, heads_last=True, seed=0):
    """q, k shifted by 0.7, v with an offset per channel (what smoothing takes out)."""
    g = torch.Generator().manual_seed(seed)

    def make(n, shift=0.0):
        t = (torch.randn(b, n, h, d, generator=g) * 1.5 + shift).to(BF16)
        return t.transpose(1, 2) if heads_last else t.transpose(1, 2).contiguous()
    return make(s), make(s_k, shift=0.7), make(s_k, shift=2.0 * torch.randn(d, generator=g))


@pytest.mark.parametrize("b,h,s,s_k,d,heads_last", [(1, 2, 200, 200, 64, True), (2, 1, 70, 130, 128, True),
                                                    (1, 3, 65, 17, 64, False)])
def test_operands_are_the_references_bits_in_cudnns_order(b, h, s, s_k, d, heads_last):
    q, k, v = _qkv(b, h, s, s_k, d, heads_last)
    q8, k8, v8, q_scale, k_scale, v_mean, v_scale = fp8_heads.quantize_operands(q, k, v)
    want = quantized_operands(q, k, v)
    for got, ref in ((q8, want[0]), (k8, want[2]), (v8, want[4])):
        assert got.dtype == E4M3 and got.is_contiguous() and got.shape == ref.transpose(1, 2).shape
        assert torch.equal(got.view(torch.uint8), ref.transpose(1, 2).contiguous().view(torch.uint8))
    for got, ref in ((q_scale, want[1]), (k_scale, want[3]), (v_mean, want[5]), (v_scale, want[6])):
        assert torch.equal(got, ref)
    assert float(q8.float().abs().max()) == 448.0 and float(k8.float().abs().max()) == 448.0


def test_padded_copies_hold_zeros_past_the_tokens_and_the_restoration_reads_the_first_ones():
    """The copies of a geometry cuDNN takes only padded: the tokens, then zeros; the output's
    first tokens restored from a padded one."""
    q, k, v = _qkv(2, 2, 70, 50, 64)
    q8, k8, v8, *_ = fp8_heads.quantize_operands(q, k, v, 128, 128)
    plain = fp8_heads.quantize_operands(q, k, v)
    for got, want, s in ((q8, plain[0], 70), (k8, plain[1], 50), (v8, plain[2], 50)):
        assert got.shape == (2, 128, 2, 64) and torch.equal(got[:, :s].view(torch.uint8), want.view(torch.uint8))
        assert not got[:, s:].view(torch.uint8).any()
    mean, scale = torch.randn(2, 2, 1, 64), torch.rand(2, 2, 64) + 0.01
    o8 = (torch.randn(2, 128, 2, 64) * 50).to(E4M3)
    got = fp8_heads.restore_heads(o8, mean, scale, torch.float32, 70)
    assert got.shape == (2, 70, 2, 64)
    assert torch.equal(got, fp8_heads.restore_heads(o8[:, :70].contiguous(), mean, scale, torch.float32))


def test_the_output_restored_as_the_reference_restores_it():
    b, h, s, d = 1, 2, 150, 64
    g = torch.Generator().manual_seed(1)
    o8 = (torch.randn(b, s, h, d, generator=g) * 100).clamp(-448, 448).to(E4M3)
    mean, scale = torch.randn(b, h, 1, d, generator=g), torch.rand(b, h, d, generator=g) + 0.01
    want = restore_values(o8.transpose(1, 2), mean, scale, torch.float32)
    assert torch.equal(fp8_heads.restore_heads(o8, mean, scale, torch.float32).transpose(1, 2), want)
    got = fp8_heads.restore_heads(o8, mean, scale, BF16).transpose(1, 2)
    assert got.dtype == BF16 and got.transpose(1, 2).is_contiguous()
    assert float(((got.float() - want) / want.abs().clamp_min(1e-30)).abs().max()) <= 2 ** -7
