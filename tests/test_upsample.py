"""Family upsample: a nearest-neighbour doubling of a contiguous map is one op, equal to eager;
other factors, modes and layouts stay ATen's. (The kernel: tests/interpreter/test_upsample_interp.py,
bit for bit against ATen on the GPU: tests/gpu/test_examples_gpu.py.)"""
import pytest
import torch
import torch.nn.functional as F

import sgdiff

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Upsamplings(torch.nn.Module):
    def forward(self, x):
        return (F.interpolate(x, scale_factor=2.0, mode="nearest"),  # diffusers' Upsample2D: a site
                F.interpolate(x, size=(2 * x.shape[2], 2 * x.shape[3]), mode="nearest"),  # a site
                F.interpolate(x, scale_factor=3.0, mode="nearest"),  # not doubled
                F.interpolate(x, scale_factor=2.0, mode="nearest-exact"),  # another op
                F.interpolate(x.contiguous(memory_format=torch.channels_last), scale_factor=2.0, mode="nearest"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_doublings_are_sites_and_equal(dtype):
    model, x = Upsamplings(), torch.randn(2, 5, 6, 7, dtype=dtype)
    report = sgdiff.explain(model, x)
    assert report.ops["upsample_nearest"] == 2 and report.found["upsample"] == 4, str(report)
    reasons = sorted(r for family, _, r in report.skipped if family == "upsample")
    assert reasons == ["not a contiguous map", "not doubled in both dims (or a symbolic size)"], reasons
    with torch.no_grad():
        got, want = torch.compile(model, backend="sgdiff")(x), model(x)
    assert all(g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))
