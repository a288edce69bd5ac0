"""Family ``pad``: ``constant_pad_nd(cat([a, b], dim), pad, value)`` as sgdiff::cat_pad — every
spelling one site and equal to eager, near misses left alone; Wan's VAE decode through it.
The kernel's bits: tests/interpreter/test_cat_pad_interp.py (a copy: exact under the
interpreter too) and tests/gpu/test_examples_gpu.py at the decoder's real sizes."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings, strategies as st

import sgdiff
from sgdiff import zoo
from tests.capture import rewrite

ONLY = ["pad"]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_wans_vae_decoder_every_causal_convolution_a_site_and_equal():
    """Wan's VAE (tiny): each causal convolution after the first chunk pads the cat of its cached
    frames and its input (29 sites, strided inputs among them after the temporal upsampling),
    those of the first chunk pad their input alone (17); two zero pads of permuted maps (a
    clone keeping their strides) are not sites."""
    vae = zoo._wan_vae("tiny").eval().requires_grad_(False)
    z = torch.randn(1, 4, 3, 8, 8)
    report = sgdiff.explain(vae.decode, z, return_dict=False)
    assert report.counts["pad"] == 46 and report.found["pad"] == 48, str(report)
    skipped = [reason for family, _, reason in report.skipped if family == "pad"]
    assert skipped == ["the output not contiguous (the op writes a contiguous one)"] * 2
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
        assert torch.equal(got, vae.decode(z, return_dict=False)[0])


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(1, 5), dim=st.integers(0, 4), sizes=st.lists(st.integers(1, 4), min_size=5, max_size=5),
       extra=st.integers(1, 3), pads=st.lists(st.integers(-1, 2), min_size=2, max_size=10),
       value=st.sampled_from([0.0, 1.0, -2.5]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       transposed=st.booleans(), cat=st.booleans())
@example(rank=3, dim=0, sizes=[1, 1, 1, 1, 1], extra=2, pads=[0, 0, 0, 1, -1, -1], value=0.0, dtype=torch.float32,
         transposed=False, cat=False)  # no cat: a pad of -2 on a size of 1, which eager refuses
def test_any_cat_and_pad_is_one_site_and_equal(rank, dim, sizes, extra, pads, value, dtype, transposed, cat):
    dim = dim % rank
    shape_a = sizes[:rank]
    shape_b = list(shape_a)
    shape_b[dim] = extra
    pad = pads[: 2 * (len(pads) // 2)][: 2 * rank]
    out = [s + shape_b[d] * (d == dim and cat) for d, s in enumerate(shape_a)]  # the padded tensor's shape
    for i in range(len(pad) // 2):
        out[rank - 1 - i] += pad[2 * i] + pad[2 * i + 1]
    if min(out) <= 0:  # a pad that eager refuses (a negative size)
        return
    a, b = torch.randn(shape_a).to(dtype), torch.randn(shape_b if cat else shape_a).to(dtype)

    def chain(a, b):
        if transposed and rank > 1:  # an input read through a view (b's dims swapped back)
            b = b.transpose(0, -1).contiguous().transpose(0, -1)
        return F.pad(torch.cat([a, b], dim=dim) if cat else b + 1, pad, value=value)

    run, gm, result = rewrite(chain, (a, b), families=ONLY)
    # a site wherever eager's output is contiguous (with no pad above zero, ATen clones its
    # input, keeping a strided one's strides: not a site)
    assert result.counts.get("pad", 0) == int(chain(a, b).is_contiguous()), str(result)
    assert cat or transposed or result.counts["pad"] == 1
    assert torch.equal(run(a, b), chain(a, b))


class NearMisses(torch.nn.Module):
    def forward(self, a, b, c):
        kept = torch.cat([a, b], dim=1)              # the cat read twice: its pad alone is the site
        three = torch.cat([a, b, c], dim=1)          # three tensors: the pad alone is the site
        reflect = F.pad(torch.cat([a, c], dim=1), (1, 1), mode="reflect")  # not a constant pad
        mixed = F.pad(torch.cat([a, b.double()], dim=1), (1, 1))           # cat promotes: fp64, not a site
        return F.pad(kept, (1, 1)) + kept.sum(), F.pad(three, (0, 2)), reflect, mixed


def test_near_misses_stay_as_they_are():
    """The cats the pads cannot take stay cats (their pads alone are sites); a reflect pad is not
    a constant one; fp64 is not a dtype the op writes (the guard's reason, for the cat and the
    pad alone)."""
    model = NearMisses()
    a, b, c = torch.randn(2, 3, 5), torch.randn(2, 3, 5), torch.randn(2, 1, 5)
    report = sgdiff.explain(model, a, b, c)
    assert report.counts.get("pad", 0) == 2, str(report)
    reasons = [reason for family, name, reason in report.skipped if family == "pad"]
    assert any("another user" in r for r in reasons) and any("one dtype" in r for r in reasons), reasons
    with torch.no_grad():
        got = torch.compile(model, backend="sgdiff")(a, b, c)
        want = model(a, b, c)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_channels_last_output_is_not_a_site():
    """A cat of channels-last maps is channels-last, and so is its pad: the op writes contiguous."""
    a = torch.randn(1, 4, 3, 5).to(memory_format=torch.channels_last)
    b = torch.randn(1, 4, 3, 5).to(memory_format=torch.channels_last)
    report = sgdiff.explain(lambda a, b: F.pad(torch.cat([a, b], dim=1), (1, 1, 1, 1)), a, b)
    assert report.counts.get("pad", 0) == 0
    assert any("not contiguous" in reason for family, _, reason in report.skipped if family == "pad"), str(report)
