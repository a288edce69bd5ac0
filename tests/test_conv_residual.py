"""Family conv_residual, and GroupNorm's convolution: a biased convolution read by a residual sum
(``(x + conv(h)) / s``, ``conv(h) + x``) or by a GroupNorm alone becomes one op whose kernels add
the bias on read — sites counted exactly in VAE decoders, spellings and near misses, outputs
equal to eager. (The kernels' bits: tests/interpreter/test_conv_residual_interp.py,
test_group_norm_interp.py; against cuDNN and ATen on the GPU: tests/gpu/test_examples_gpu.py
and tests/gpu/test_vae_gpu.py.)"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import sgdiff
from sgdiff import zoo
from tests.capture import rewrite

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")
FAMILIES = ["conv_residual", "group_norm"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fluxs_vae_decoder(dtype):
    """Flux's VAE (tiny: the mid block's two ResNets, the up block's two): each block's ``conv2``
    and its sum (4), each ``conv1`` and ``norm2`` + SiLU (4); the other norms read a convolution
    with another reader (the residual) or a sum, and stay plain GroupNorms (5)."""
    vae = zoo._flux_vae("tiny").to(dtype).eval().requires_grad_(False)
    z = torch.randn(1, 4, 8, 8, dtype=dtype)
    report = sgdiff.explain(vae.decode, z, return_dict=False)
    assert report.ops["conv_residual"] == 4 and report.ops["conv_group_norm"] == 4, str(report)
    assert report.ops["group_norm"] == 5 and report.found["group_norm"] == 9, str(report)
    skipped = {(op, reason.split(" (")[0]) for family, op, reason in report.skipped if family in FAMILIES}
    assert skipped == {("conv_group_norm", "intermediate convolution has another user")}, skipped
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
        assert torch.equal(got, vae.decode(z, return_dict=False)[0])


def test_wans_vae_decoder():
    """Wan's VAE (tiny): every residual block's causal ``conv2`` plus its shortcut, 3-D (18)."""
    vae = zoo._wan_vae("tiny").eval().requires_grad_(False)
    z = torch.randn(1, 4, 3, 8, 8)
    report = sgdiff.explain(vae.decode, z, return_dict=False)
    assert report.ops["conv_residual"] == report.found["conv_residual"] == 18, str(report)
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
        assert torch.equal(got, vae.decode(z, return_dict=False)[0])


@settings(max_examples=12, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16]), conv_first=st.booleans(),
       divisor=st.sampled_from([None, 1.0, 2.0, 1.4142]), three_d=st.booleans(), stride=st.sampled_from([1, 2]))
def test_every_spelling_of_the_sum_is_one_site_and_equal(dtype, conv_first, divisor, three_d, stride):
    conv = (torch.nn.Conv3d if three_d else torch.nn.Conv2d)(6, 6, 3, padding=1, stride=stride).to(dtype)
    x = torch.randn(1, 6, *((4,) if three_d else ()), 8, 10, dtype=dtype)
    r = torch.randn_like(conv(x))

    def chain(x, r, w, b):
        y = F.conv3d(x, w, b, stride, 1) if three_d else F.conv2d(x, w, b, stride, 1)
        s = y + r if conv_first else r + y
        return s if divisor is None else s / divisor

    inputs = (x, r, conv.weight.detach(), conv.bias.detach())
    run, gm, result = rewrite(chain, inputs, families=FAMILIES)
    assert result.counts.get("conv_residual") == 1, str(result)
    assert [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default] == []
    with torch.no_grad():
        assert torch.equal(run(*inputs), chain(*inputs))


class NearMisses(torch.nn.Module):
    """Sums and norms of convolutions that must stay as they are: a convolution read twice (its
    sum and its norm are plain), one without a bias (nothing to fold), a residual broadcast
    across the map, a sum with an alpha, a transposed convolution; and one site to count. Each
    case has a convolution of its own (one convolution of one input made twice is one value:
    fxpasses.repeated)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.c, self.d, self.e = (torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(3))
        self.t = torch.nn.ConvTranspose2d(8, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, 8)

    def forward(self, x, row):
        a = self.a(x)
        read_twice = (x + a, self.norm(a))
        return (*read_twice, x + self.b(x), self.c(x) + row, torch.add(x, self.d(x), alpha=2), x + self.t(x),
                self.norm(self.e(x)))


def test_near_misses_stay_as_they_are():
    model, x, row = NearMisses().eval(), torch.randn(1, 8, 6, 6), torch.randn(1, 8, 1, 6)
    report = sgdiff.explain(model, x, row)
    assert report.ops.get("conv_residual", 0) == 0 and report.ops["conv_group_norm"] == 1, str(report)
    reasons = sorted(r for family, _, r in report.skipped if family == "conv_residual")
    assert reasons == ["a sum with alpha", "intermediate convolution has another user (native_group_norm)",
                       "the residual is broadcast against the convolution's output"], reasons
    with torch.no_grad():
        got, want = torch.compile(model, backend="sgdiff")(x, row), model(x, row)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
