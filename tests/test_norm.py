"""Family ``norm``: an RMSNorm or LayerNorm wherever it stands, once the families that fuse norms
into more (QK-norm + RoPE, LayerNorm/RMSNorm + modulate) have run — every eager spelling one
site and bitwise equal, the fusions kept, near misses left alone. The kernels' bits on the GPU:
tests/gpu/test_rowwise_ops_gpu.py and tests/gpu/test_layernorm_modulate_gpu.py."""
import pytest
import torch
import torch.nn.functional as F
from diffusers.models.normalization import RMSNorm
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import registry
from tests.capture import diffusers_rms_norm, rewrite
from tests.helpers import bits_equal, count_op

RMS = registry.op_def("rms_norm").load()
LN = registry.op_def("layer_norm").load()

SPELLINGS = {
    "F.rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
    "torch.nn.RMSNorm": lambda x, w, b: torch.func.functional_call(
        torch.nn.RMSNorm(x.shape[-1], 1e-6, dtype=w.dtype), {"weight": w}, (x,)),
    "diffusers RMSNorm": lambda x, w, b: diffusers_rms_norm(x, w, 1e-6),
    "F.layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
}


@settings(max_examples=12, deadline=None)
@given(spelling=st.sampled_from(sorted(SPELLINGS)), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       shape=st.sampled_from([(1, 6, 4, 16), (2, 5, 24), (3, 40)]), feed=st.sampled_from(["input", "sum", "strided"]))
def test_a_norm_is_a_site_whatever_feeds_it(spelling, dtype, shape, feed):
    """Over [B, S, H, D] fed by no projection, over a model's width, of a sum, of a transposed
    view: one site (rms_norm or layer_norm), bitwise equal."""
    def fn(x, y, w, b):
        src = {"input": x, "sum": x + y, "strided": x.transpose(0, -2).contiguous().transpose(0, -2)}[feed]
        return SPELLINGS[spelling](src, w, b)

    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    w, b = (torch.randn(shape[-1], generator=g).to(dtype) for _ in range(2))
    run, gm, result = rewrite(fn, (x, y, w, b), families=["norm"])
    op = LN if spelling == "F.layer_norm" else RMS
    assert result.counts["norm"] == count_op(gm, op) == 1, str(result)
    assert bits_equal(run(x, y, w, b), fn(x, y, w, b))


def test_the_fusions_keep_their_norms():
    """A QK-norm before attention stays the qk_norm family's, a LayerNorm that a modulation
    reads stays the modulate family's: the norm family takes what they leave (the text norm)."""
    def fn(q, t, w, scale, shift):
        qk = F.rms_norm(q.unflatten(-1, (2, 8)), (8,), w[:8], 1e-6)
        modulated = F.layer_norm(t, (16,), None, None, 1e-6) * (1 + scale) + shift
        return qk, modulated, diffusers_rms_norm(t, w, 1e-6)

    args = (torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(16), torch.randn(2, 1, 16), torch.randn(2, 1, 16))
    run, gm, result = rewrite(fn, args)
    assert (result.counts["qk_norm"], result.counts["modulate"], result.counts["norm"]) == (1, 1, 1), str(result)
    assert all(bits_equal(g, w) for g, w in zip(run(*args), fn(*args)))


@pytest.mark.parametrize("name,fn", [
    ("over two dims", lambda t, w: F.rms_norm(t, t.shape[-2:], None, 1e-6)),
    ("cube, not square", lambda t, w: t * torch.rsqrt(t.pow(3).mean(-1, keepdim=True) + 1e-6)),
    ("another tensor normalized", lambda t, w: (t + 1) * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)),
    ("a bf16 reduction, no upcast", lambda t, w: t.bfloat16() * torch.rsqrt(
        t.bfloat16().pow(2).mean(-1, keepdim=True) + 1e-6)),
])
def test_near_misses_are_not_norms(name, fn):
    args = (torch.randn(2, 5, 16), torch.randn(16))
    run, gm, result = rewrite(fn, args, families=["norm"])
    assert result.counts["norm"] == 0 and count_op(gm, RMS) == 0, name
    assert bits_equal(run(*args), fn(*args))


def test_diffusers_rms_norm_module_over_video_tokens():
    """diffusers' RMSNorm module over [B, F, S, D] video tokens (#36's example shape, smaller)."""
    norm = RMSNorm(32, 1e-6)
    x = torch.randn(1, 3, 10, 32)
    run, gm, result = rewrite(lambda x, w: torch.func.functional_call(norm, {"weight": w}, (x,)),
                              (x, norm.weight.detach()), families=["norm"])
    assert result.counts["norm"] == 1
    assert bits_equal(run(x, norm.weight.detach()), norm(x))
