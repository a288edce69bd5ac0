"""Family group_norm: GroupNorm (+ SiLU) sites, counted exactly, rewritten with outputs equal to
eager; near misses that must stay as they are. (Bits against ATen on the GPU:
tests/gpu/test_group_norm_gpu.py; the kernels' order under the interpreter:
tests/interpreter/test_group_norm_interp.py.)"""
import pytest
import torch
import torch.nn.functional as F

import sgdiff
from sgdiff import patterns, zoo

ON = {"families": ("group_norm",)}  # off by default (sgdiff/patterns/group_norm.py)

pytest.importorskip("diffusers")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_vae_decoder_every_norm_a_site_and_equal(dtype):
    """Flux's VAE (tiny): the mid block's two ResNets and the up block's two, a GroupNorm + SiLU
    before each convolution (8), and conv_norm_out + SiLU (1)."""
    vae = zoo._flux_vae("tiny").to(dtype).eval().requires_grad_(False)
    z = torch.randn(1, 4, 8, 8, dtype=dtype)
    report = sgdiff.explain(vae.decode, z, return_dict=False, options=ON)
    assert report.counts["group_norm"] == report.found["group_norm"] == 9, str(report)
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff", options=ON)(z, return_dict=False)[0]
        assert torch.equal(got, vae.decode(z, return_dict=False)[0])


class Norms(torch.nn.Module):
    """Three GroupNorms: one + SiLU, one whose output is read twice (its SiLU cannot join), one
    without an affine (ATen's other formula: not a site)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.GroupNorm(4, 16), torch.nn.GroupNorm(4, 16, eps=1e-5)
        self.c = torch.nn.GroupNorm(4, 16, affine=False)

    def forward(self, x):
        y = F.silu(self.a(x))
        n = self.b(y)
        return F.silu(n) + n, self.c(x)


def test_near_misses_stay_as_they_are():
    model, x = Norms().eval(), torch.randn(2, 16, 5, 7)
    report = sgdiff.explain(model, x, options=ON)
    assert report.counts["group_norm"] == 2, str(report)  # a with its SiLU, b alone
    reasons = sorted(reason for family, _, reason in report.skipped if family == "group_norm")
    assert reasons[0] == "a GroupNorm without its affine weight and bias" and "has another user" in reasons[1]
    with torch.no_grad():
        got = torch.compile(model, backend="sgdiff", options=ON)(x)
        want = model(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_on_by_default_and_off_when_the_families_leave_it_out():
    vae = zoo._flux_vae("tiny").eval().requires_grad_(False)
    z = torch.randn(1, 4, 8, 8)
    assert sgdiff.explain(vae.decode, z, return_dict=False).counts["group_norm"] == 9
    others = {"families": [f for f in patterns.default_families() if f != "group_norm"]}
    assert sgdiff.explain(vae.decode, z, return_dict=False, options=others).counts.get("group_norm", 0) == 0


def test_the_reference_takes_a_layout_the_cpu_kernel_refuses():
    """A channels-last view with a short batch stride (what a capture's fake strides can call
    contiguous: Flux's VAE after its attention, on the CPU): the reference copies it as
    F.group_norm's composite would, where ATen's CPU kernel alone raises (torch 2.13; 2.14's
    takes it)."""
    from sgdiff.kernels.group_norm import group_norm_reference

    x = torch.randn(16 * 16 * 64).as_strided((1, 64, 16, 16), (64, 1, 1024, 64))
    w, b = torch.rand(64) + 0.5, torch.randn(64)
    try:
        torch.ops.aten.native_group_norm(x, w, b, 1, 64, 256, 32, 1e-6)
    except RuntimeError:
        pass
    assert torch.equal(group_norm_reference(x, w, b, 32, 1e-6, True), F.silu(F.group_norm(x, 32, w, b, 1e-6)))
