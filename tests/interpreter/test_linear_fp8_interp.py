"""linear_fp8's Triton parts under the interpreter: the rows' scales and e4m3 values are the
reference's bits (the interpreter's fp32 division is IEEE's; its own fp32 -> e4m3 cast is not the
GPU's ``cvt.rn.satfinite``, so ``to_e4m3`` rounds on the e4m3 grid first), the weight copies kept
and remade, one quantization for the projections of one input."""
import gc

import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.linear_fp8 import E4M3_MAX, quantize_rows_reference  # noqa: E402
from sgdiff.kernels.triton import linear_fp8 as lf  # noqa: E402

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


@pytest.mark.parametrize("shape", [(5, 16), (37, 96), (3, 1536), (2, 3072)])
def test_scales_are_the_references_and_values_in_range(shape):
    x = (torch.randn(shape) * 3).to(BF16)
    x[0] = 0  # a row of zeros keeps the floor scale
    q, scale = lf.quantize_rows(x)
    want_q, want_scale = quantize_rows_reference(x)
    assert torch.equal(scale, want_scale) and torch.equal(q.float(), want_q.float())
    assert q.dtype == torch.float8_e4m3fn and float(q.float().abs().max()) <= E4M3_MAX
    assert torch.equal(q[0].float(), torch.zeros(shape[1]))


def _weight(n=32, k=64):
    return torch.nn.Parameter(torch.randn(n, k).to(BF16), requires_grad=False)


def test_a_weights_copy_is_kept_and_remade_in_its_memory_when_the_weight_changes():
    w = _weight()
    q, scale = lf.WEIGHTS.get(w)
    assert lf.WEIGHTS.get(w)[0] is q  # kept
    assert torch.equal(scale, quantize_rows_reference(w)[1].view(1, -1))
    with torch.no_grad():
        w.mul_(4)  # in place: a new version
    q2, scale2 = lf.WEIGHTS.get(w)
    assert q2 is q and scale2 is scale and torch.equal(scale, quantize_rows_reference(w)[1].view(1, -1))
    w.data.mul_(4)  # through .data: no version sees it ...
    assert not torch.equal(lf.WEIGHTS.get(w)[1], quantize_rows_reference(w)[1].view(1, -1))
    import sgdiff
    assert sgdiff.refresh_weights() >= 1  # ... until the copies are remade
    assert torch.equal(scale, quantize_rows_reference(w)[1].view(1, -1))
    w.data = torch.randn(32, 64).to(BF16)  # new storage: remade
    assert torch.equal(lf.WEIGHTS.get(w)[1], quantize_rows_reference(w)[1].view(1, -1))
    w.data = torch.randn(48, 64).to(BF16)  # another shape: a copy of its own, never written over the old
    q3, scale3 = lf.WEIGHTS.get(w)
    assert q3.shape == (48, 64) and torch.equal(scale3, quantize_rows_reference(w)[1].view(1, -1))


def test_a_copy_goes_with_its_weight():
    before = len(lf.WEIGHTS)
    w = _weight()
    lf.WEIGHTS.get(w)
    assert len(lf.WEIGHTS) == before + 1
    del w
    gc.collect()
    assert len(lf.WEIGHTS) == before


def test_projections_of_one_input_quantize_it_once(monkeypatch):
    """The GEMMs of three projections of ``x`` read one e4m3 copy of it; another tensor gets its own."""
    read = []
    scaled_mm = lf._compat.scaled_mm
    monkeypatch.setattr(lf._compat, "scaled_mm", lambda a, *rest, **kw: read.append(a) or scaled_mm(a, *rest, **kw))
    x = torch.randn(2, 8, 64).to(BF16)
    weights = [_weight(), _weight(), _weight()]
    outs = [lf.linear_fp8(x, w, None) for w in weights]
    assert all(o.shape == (16, 32) for o in outs) and read[0] is read[1] is read[2]
    assert torch.equal(read[0].float(), lf.quantize_rows(x.view(16, 64))[0].float())
    lf.linear_fp8(x.clone(), weights[0], None)
    assert read[3] is not read[0]
    from sgdiff.kernels import dispatch
    lf.linear_fp8(x, weights[0], None)
    dispatch.new_graph_call()  # a compiled graph's next call: x (a graph input, say) is quantized again
    lf.linear_fp8(x, weights[1], None)
    assert read[5] is not read[4]


def test_weights_side_by_side_are_each_ones_copy_and_remade_when_one_changes():
    """linear_fp8_siblings' copy: the weights' e4m3 rows one after the other, their scales and
    biases side by side; an in-place update of one weight or bias remakes it in its memory; the
    entry goes with any of its tensors."""
    ws = [_weight(32), _weight(16), _weight(48)]
    bs = [torch.randn(n).to(BF16) for n in (32, 16, 48)]

    def assert_each_ones(q, scale, b):
        want = [quantize_rows_reference(w) for w in ws]
        assert torch.equal(q.float(), torch.cat([wq for wq, _ in want]).float())
        assert torch.equal(scale, torch.cat([s for _, s in want]).view(1, -1)) and torch.equal(b, torch.cat(bs))

    q, scale, b = lf.WEIGHTS.side_by_side(ws, bs)
    assert q.shape == (96, 64) and scale.shape == (1, 96)
    assert_each_ones(q, scale, b)
    assert lf.WEIGHTS.side_by_side(ws, bs)[0] is q  # kept
    with torch.no_grad():
        ws[1].mul_(4)
        bs[2].add_(1)
    again = lf.WEIGHTS.side_by_side(ws, bs)
    assert again[0] is q and again[1] is scale and again[2] is b
    assert_each_ones(q, scale, b)
    assert lf.WEIGHTS.side_by_side(ws, ())[2] is None  # without biases: an entry of its own
    before = len(lf.WEIGHTS)
    del ws[0]
    gc.collect()
    assert len(lf.WEIGHTS) == before - 2


def test_siblings_are_one_gemm_of_the_side_by_side_copy(monkeypatch):
    """linear_fp8_siblings: x quantized once, one GEMM over the weights' copy, each projection's
    columns within one bf16 rounding of its own linear_fp8 (the CPU's GEMM may sum in another order)."""
    from sgdiff.kernels.linear_fp8_siblings import linear_fp8_siblings_reference

    calls = []
    scaled_mm = lf._compat.scaled_mm
    monkeypatch.setattr(lf._compat, "scaled_mm", lambda *a, **kw: calls.append(a[1].shape) or scaled_mm(*a, **kw))
    x = torch.randn(2, 8, 64).to(BF16)
    ws, bs = [_weight(32), _weight(16)], [torch.randn(32).to(BF16), torch.randn(16).to(BF16)]
    got = lf.linear_fp8_siblings(x, ws, bs)
    assert got.shape == (16, 48) and calls == [(64, 48)]
    want = linear_fp8_siblings_reference(x, ws, bs)
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("example", [0, 1], ids=["flux-chunk", "wan-fp32-table"])
def test_a_modulated_norms_rows_are_linear_fp8s_rows_of_it(example):
    """layernorm_modulate_linear_fp8's kernel: the e4m3 rows and scales linear_fp8 makes of the
    LayerNorm-modulate's output (bf16 values an interpreter's truncation apart: a bf16 rounding),
    and the op's GEMM over them within a bf16 rounding of its reference. The interpreter truncates
    each of the chain's three bf16 roundings (the norm, the product, the sum): a row's largest
    value may come out up to three ulps low."""
    from sgdiff.kernels import registry
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
    from sgdiff.kernels.layernorm_modulate_linear_fp8 import layernorm_modulate_linear_fp8_reference
    from sgdiff.kernels.triton import layernorm_modulate_fp8 as lmf

    args = registry.op_def("layernorm_modulate_linear_fp8").examples[example].args(small=True, tokens=4)
    x, w, b, eps, scale, shift, plus_one, x_dtype, out_dtype, scale_add, shift_add = args[:11]
    q, s = lmf._quantizer(x, w, b, scale, shift, plus_one, x_dtype, out_dtype, scale_add, shift_add)(
        x, w, b, eps, scale, shift, scale_add, shift_add)
    h = layernorm_modulate_reference(*args[:11])
    want_q, want_s = quantize_rows_reference(h.reshape(-1, h.shape[-1]))
    assert float(((s - want_s).abs() / want_s).max()) <= 3 * 2 ** -7
    # values: where the modulation's product and shift cancel, three truncations are far from a bf16
    # rounding of the small result; against the row's largest value they are within an e4m3 step
    # (2^-3 of it at most: 32 between 256 and 448)
    assert float(((q.float() * s - want_q.float() * want_s).abs() / (want_s * 448)).max()) <= 2 ** -3
    assert float((q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean()) <= 0.25
    got, want = lmf.layernorm_modulate_linear_fp8(*args), layernorm_modulate_linear_fp8_reference(*args)
    assert got.shape == want.shape == (h.numel() // h.shape[-1], sum(wt.shape[0] for wt in args[11]))
    assert float((got.float() - want.float()).abs().max()) <= 2 ** -4 * float(want.float().abs().max())
