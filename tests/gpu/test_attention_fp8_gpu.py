"""sgdiff::attention_fp8 on Hopper (cuDNN's FP8 attention through the cuDNN frontend): the e4m3
operands are the reference's bits; the output departs from the reference's math by about as much
as that math departs from exact attention (cuDNN's online softmax rounds P at other shifts), at Flux's,
Wan's and smaller shapes, causal too; Wan's self-attention at its 32760 tokens stays near eager's;
a CUDA graph replays it; attention_int8's first sight times it; its GPU time against eager's
kernel (printed: run with -s)."""
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from sgdiff.kernels import registry, tuning
from sgdiff.kernels.attention_fp8 import attention_fp8_reference, quantized_operands

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
cudnn_fp8 = pytest.importorskip("sgdiff.kernels.cudnn.attention_fp8")
if not cudnn_fp8.available():
    pytest.skip("the cuDNN frontend (nvidia-cudnn-frontend) is not installed", allow_module_level=True)
if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("cuDNN's FP8 attention needs Hopper", allow_module_level=True)


def _qkv(b, h, s, d, s_k=None, seed=0):
    """diffusers' [B, S, H, D] projections seen heads-first; k shifted, v offset per channel."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def make(n, shift):
        return (torch.randn(b, n, h, d, device="cuda", generator=g) + shift).to(BF16).transpose(1, 2)
    return make(s, 0.0), make(s_k or s, 0.5), make(s_k or s, torch.randn(d, device="cuda", generator=g))


def _added(exact, v):
    return float((exact.float() - v.float().mean(dim=2, keepdim=True)).norm())


CASES = [(1, 24, 4608, 128, None, False),  # Flux.1-dev 1024²
         (1, 12, 4096, 128, 512, False),  # Wan 2.1 cross-attention, fewer image tokens
         (2, 4, 1000, 64, None, False), (1, 4, 1000, 128, None, True), (1, 2, 333, 64, 77, False)]


@pytest.mark.parametrize("b,h,s,d,s_k,causal", CASES)
def test_attention_fp8_keeps_the_operands_bits_and_stays_near_its_math(fresh_dispatch, b, h, s, d, s_k, causal):
    from sgdiff.kernels.triton import fp8_heads

    q, k, v = _qkv(b, h, s, d, s_k)
    got8 = fp8_heads.quantize_operands(q, k, v)
    want8 = quantized_operands(q, k, v)
    for got, want in zip(got8[:3], want8[0:6:2]):
        assert torch.equal(got.view(torch.uint8), want.transpose(1, 2).contiguous().view(torch.uint8))
    got = cudnn_fp8.attention_fp8(q, k, v, causal, None)
    want = attention_fp8_reference(q, k, v, causal, None)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert got.shape == want.shape and got.dtype == BF16 and got.transpose(1, 2).is_contiguous()
    own = float((want.float() - exact).norm())
    assert float((got.float() - want.float()).norm()) <= 1.5 * own  # other roundings of P, not other math
    assert float((got.float() - exact).norm()) <= 0.1 * _added(exact, v) + 0.03 * float(exact.norm())
    op = registry.op_def("attention_fp8").load()
    assert torch.equal(op(q, k, v, causal, None), got)  # the op runs the cuDNN implementation


def test_wan_self_attention_at_its_length_stays_near_eager():
    q, k, v = _qkv(1, 12, 32760, 128)
    got = cudnn_fp8.attention_fp8(q, k, v, False, None).float()
    eager = F.scaled_dot_product_attention(q, k, v).float()
    assert float((got - eager).norm()) <= 0.1 * _added(eager, v) + 0.03 * float(eager.norm())


def test_the_fastest_plan_is_chosen_once_and_keeps_the_math(caplog):
    """Each geometry's plans (cuDNN's ranking), as it is and padded, timed once, at its first launch:
    one choice, logged; the chosen plan's output near exact attention as the reference's is, and
    the same on every run."""
    q, k, v = _qkv(1, 6, 3000, 128, seed=4)  # a geometry no other test builds; 3000 tokens: padded too
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        got = cudnn_fp8.attention_fp8(q, k, v, False, None)
        again = cudnn_fp8.attention_fp8(q, k, v, False, None)
    chosen = [r.getMessage() for r in caplog.records if "us; kept" in r.getMessage()]
    assert len(chosen) == 1, chosen
    print(f"\n{chosen[0]}")
    assert torch.equal(got, again)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    own = float((attention_fp8_reference(q, k, v, False, None).float() - exact).norm())
    assert float((got.float() - exact).norm()) <= 1.5 * own


def test_a_cuda_graph_replays_it():
    q, k, v = _qkv(1, 8, 2048, 128)
    launch = cudnn_fp8.bind(q, k, v, False, None)
    want = launch(q, k, v, False, None)  # the first launch builds the cuDNN graph, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch(q, k, v, False, None)
    for t, seed in ((q, 5), (k, 6), (v, 7)):  # new inputs, same tensors
        t.copy_(torch.randn(t.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(out, want) and torch.equal(out, launch(q, k, v, False, None))


def test_attention_int8s_first_sight_times_it(fresh_dispatch, caplog):
    from sgdiff.kernels.triton import attention_int8 as ai

    q, k, v = _qkv(1, 24, 4608, 128, seed=3)
    with caplog.at_level(logging.INFO, logger="sgdiff"):
        registry.op_def("attention_int8").load()(q, k, v, False, None)
    timed = [r.getMessage() for r in caplog.records if "attention_int8 (1, 24, 4608, 128)" in r.getMessage()]
    assert timed and "cudnn fp8 " in timed[0], timed
    print(f"\n{timed[0]}; kept {[c for key, c in ai.choices() if key == tuple(q.shape)]}")


@pytest.mark.parametrize("b,h,s,d,s_k", [(1, 24, 4608, 128, None), (1, 12, 32760, 128, None),
                                         (1, 12, 32760, 128, 512)])
def test_attention_fp8_times_against_eager(b, h, s, d, s_k, capsys):
    """GPU time against eager's kernel, alternating (printed: run with -s); FLOP/s of q k^T and P v."""
    from sgdiff.kernels.triton import fp8_heads

    q, k, v = _qkv(b, h, s, d, s_k)
    plan = cudnn_fp8.chosen_plan((q.device, b, h, s, k.shape[2], d, False, d ** -0.5), q, k, v)
    q8, k8, v8, q_scale, k_scale, v_mean, v_scale = fp8_heads.quantize_operands(q, k, v, *plan.rows)
    o8 = torch.empty_like(q8)
    calls = [lambda: F.scaled_dot_product_attention(q, k, v), lambda: cudnn_fp8.attention_fp8(q, k, v, False, None),
             # its parts: the operands' quantization, cuDNN's kernel, the output's restoring
             lambda: fp8_heads.quantize_operands(q, k, v, *plan.rows),
             lambda: plan.run(q8, k8, v8, q_scale, k_scale, o8),
             lambda: fp8_heads.restore_heads(o8, v_mean, v_scale, q.dtype, s)]
    for c in calls:
        c()
    times = tuning.best_times([lambda _, c=c: c() for c in calls], (q,))
    flop = 4 * b * h * s * k.shape[2] * d
    with capsys.disabled():
        print(f"\nattention_fp8 {(b, h, s, d, k.shape[2])}: eager {times[0] * 1e6:.1f} us "
              f"({flop / times[0] / 1e12:.0f} TFLOP/s), cudnn fp8 {times[1] * 1e6:.1f} us "
              f"({flop / times[1] / 1e12:.0f} TFLOP/s), {times[1] / times[0]:.3f}x; its parts: quantize "
              f"{times[2] * 1e6:.1f} us, cuDNN's kernel {times[3] * 1e6:.1f} us ({flop / times[3] / 1e12:.0f} "
              f"TFLOP/s), restore {times[4] * 1e6:.1f} us")
    assert all(t > 0 for t in times) and math.isfinite(times[1])
