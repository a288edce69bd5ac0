"""Family ``normalize``: what follows the norm of ``F.normalize(x, dim=1)`` scaled with a
per-channel affine (diffusers' ``WanRMS_norm``) and the SiLU after it, as
sgdiff::channel_normalize — every spelling one site and equal to eager, near misses left alone.
The kernel's bits: tests/interpreter/test_channel_normalize_interp.py (fp32) and
tests/gpu/test_examples_gpu.py at Wan's real sizes."""
import pytest
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm
from hypothesis import given, settings, strategies as st

import sgdiff
from sgdiff import zoo
from tests.capture import rewrite

ONLY = ["normalize"]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_wans_vae_decoder_every_norm_a_site_and_equal(dtype):
    """Wan's VAE (tiny): its RMS norms, with the SiLU after them in the residual blocks and the
    head, on contiguous maps and on the frame-major maps a spatial upsampling leaves (42)."""
    vae = zoo._wan_vae("tiny").to(dtype).eval().requires_grad_(False)
    z = torch.randn(1, 4, 3, 8, 8, dtype=dtype)
    report = sgdiff.explain(vae.decode, z, return_dict=False)
    assert report.counts["normalize"] == report.found["normalize"] == 42, str(report)
    assert not [s for s in report.skipped if s[0] == "normalize"], str(report)
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
        assert torch.equal(got, vae.decode(z, return_dict=False)[0])


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), silu=st.booleans(),
       bias=st.booleans(), images=st.booleans(), channels=st.integers(1, 6), batch=st.integers(1, 2))
def test_the_module_itself_is_one_site_and_equal(dtype, silu, bias, images, channels, batch):
    norm = WanRMS_norm(channels, images=images, bias=bias).to(dtype)
    with torch.no_grad():
        norm.gamma.add_(0.1 * torch.randn_like(norm.gamma))
        if bias:
            norm.bias.add_(torch.randn_like(norm.bias))
    x = torch.randn(batch, channels, *((5, 7) if images else (2, 5, 7))).to(dtype)

    params = dict(norm.named_parameters())  # graph inputs, as torch.compile lifts them

    def chain(x, *weights):
        y = torch.func.functional_call(norm, dict(zip(params, weights)), (x,))
        return F.silu(y) if silu else y

    inputs = (x, *params.values())
    run, gm, result = rewrite(chain, inputs, families=ONLY)
    assert result.counts.get("normalize") == 1, str(result)
    with torch.no_grad():
        assert torch.equal(run(*inputs), chain(*inputs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_frame_serving_several_widths_takes_its_scale_as_an_input(dtype):
    """A block's code called with norms of several widths (Wan's decoder stages, frames compiled
    one by one): after its first recompile dynamo passes ``self.scale`` into the graph as a 0-d
    fp32 host tensor. Each graph is still one site, the op reads the scale at each call, and the
    outputs equal eager's."""
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options

    results, graphs = [], []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return SgdiffBackend(Options(), on_result=results.append)(gm, example_inputs)

    def block(norm, x):
        return F.silu(norm(x))

    compiled = torch.compile(block, backend=backend)
    with torch.no_grad():
        for channels in (4, 8, 6, 8):
            norm = WanRMS_norm(channels, images=False).to(dtype)
            norm.gamma.add_(0.1 * torch.randn_like(norm.gamma))
            x = torch.randn(1, channels, 2, 3, 5, dtype=dtype)
            assert torch.equal(compiled(norm, x), block(norm, x)), channels
    assert len(results) == len(graphs) >= 2
    assert [r.counts.get("normalize") for r in results] == [1] * len(results), [str(r.skipped) for r in results]
    lifted = [gm for gm in graphs if any(n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)
                                         and n.meta["example_value"].dim() == 0 for n in gm.graph.nodes)]
    assert lifted, "no graph took the scale as an input: the case this test is about did not occur"


class NearMisses(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.ones(4, 1, 1))
        self.gamma32 = torch.nn.Parameter(torch.ones(4, 1, 1, dtype=torch.float32))

    def forward(self, x):
        last = F.normalize(x.float(), dim=-1).to(x.dtype) * 2.0 * self.gamma + 0.0     # over the last dim
        l1 = F.normalize(x.float(), p=1.0, dim=1).to(x.dtype) * 2.0 * self.gamma + 0.0  # a 1-norm
        wide = F.normalize(x.float(), dim=1).to(x.dtype) * 2.0 * self.gamma32 + 0.0    # promotes to fp32
        kept = F.normalize(x.float(), dim=1).to(x.dtype)                               # read twice
        vector = F.normalize(x.float(), dim=1).to(x.dtype) * self.gamma32[:1] * self.gamma + 0.0  # promotes to fp32
        return last, l1, wide, kept * 2.0 * self.gamma + 0.0, kept.sum(), vector


def test_near_misses_stay_as_they_are():
    model = NearMisses().to(torch.bfloat16)
    model.gamma32.data = model.gamma32.data.float()
    x = torch.randn(2, 4, 5, 7, dtype=torch.bfloat16)
    report = sgdiff.explain(model, x)
    assert report.counts.get("normalize", 0) == 0, str(report)
    reasons = {reason for family, _, reason in report.skipped if family == "normalize"}
    assert "not the 2-norm of the same tensor over dim 1, kept" in reasons, reasons
    assert "the scale is neither a number nor an fp32 number on the host" in reasons, reasons
    with torch.no_grad():
        got = torch.compile(model, backend="sgdiff")(x)
        want = model(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
