"""sgdiff::group_norm's Triton kernels under the interpreter (fp32 like the GPU: fma, correctly
rounded division) against ATen's GroupNorm order written out in torch (sgdiff/kernels/triton/
group_norm.py's docstring): each thread's serial Welford fold, the warp trees, warp 0's tree
over the warps, ``a = rstd * gamma``, ``b = (-a * mean) + beta``, ``y = fma(a, x, b)``. fp32
outputs are compared bit for bit (the statistics' order is what they test), the SiLU and bf16
within a tolerance (the interpreter's exp and bf16 rounding are not the GPU's). The bits
against ATen itself: tests/gpu/test_group_norm_gpu.py."""
import numpy as np
import pytest
import torch

from sgdiff.kernels.group_norm import group_norm_reference
from sgdiff.kernels.triton import group_norm as gk
from tests.interpreter.common import check, ids

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Loads of 16 of a thread's elements (the GPU's are larger): the same code paths, whole
    batches in groups small enough for the interpreter."""
    monkeypatch.setattr(gk, "MOMENTS_BATCH", 16)


def _fma(a, b, c):
    """fp32 fma (the product exact in fp64, one rounding of the sum but for a rare double one)."""
    return (a.double() * b.double() + c.double()).float()


def _combine(a, b):
    (am, aq, an), (bm, bq, bn) = a, b
    delta = bm - am
    count = an + bn
    ratio = bn / torch.where(count == 0, torch.ones_like(count), count)
    mean, m2 = _fma(delta, ratio, am), _fma(delta * delta * an, ratio, aq + bq)
    mean, m2, count = (torch.where(bn == 0, u, v) for u, v in ((am, mean), (aq, m2), (an, count)))
    return tuple(torch.where(an == 0, u, v) for u, v in ((bm, mean), (bq, m2), (bn, count)))


def _tree(state):
    """Lane 0's state of a shuffle-down tree over the last dim."""
    while state[0].shape[-1] > 1:
        half = state[0].shape[-1] // 2
        state = _combine(tuple(s[..., :half] for s in state), tuple(s[..., half:] for s in state))
    return tuple(s[..., 0] for s in state)


def aten_group_norm_fp32(x, weight, bias, groups, eps):
    n, c = x.shape[:2]
    rows = x.reshape(n * groups, -1)
    length = rows.shape[1]
    threads = 512 if length >= 512 else 32
    mean, m2, cnt = (torch.zeros(n * groups, threads) for _ in range(3))
    for start in range(0, length, threads):
        idx = start + torch.arange(threads)
        active = idx < length
        v = rows[:, idx.clamp(max=length - 1)]
        n1 = cnt + 1
        delta = v - mean
        new_mean = mean + delta / n1
        new_m2 = _fma(delta, v - new_mean, m2)
        mean, m2, cnt = (torch.where(active, u, w) for u, w in ((new_mean, mean), (new_m2, m2), (n1, cnt)))
    warps = _tree(tuple(s.reshape(n * groups, threads // 32, 32) for s in (mean, m2, cnt)))
    mean, m2, cnt = _tree(warps)
    var = (m2 / cnt + eps).numpy()
    rstd = torch.from_numpy(np.float32(1.0) / np.sqrt(var))  # (torch's CPU 1 / t can be an ulp off)
    a = (rstd.reshape(n, groups, 1) * weight.reshape(1, groups, -1)).reshape(n * c, 1)
    b = -a * mean.reshape(n, groups, 1).expand(n, groups, c // groups).reshape(n * c, 1) + bias.repeat(n)[:, None]
    return _fma(a, x.reshape(n * c, -1), b).reshape(x.shape)


CASES = [  # (shape, groups): ATen's 512 threads a group, 32, batch 2, a tail, 5-D (a video VAE)
    ((1, 16, 16, 16), 8), ((1, 32, 8, 9), 8), ((2, 64, 8, 8), 32), ((1, 8, 3, 5), 4), ((1, 32, 2, 8, 8), 32),
]


@pytest.mark.parametrize("shape,groups", CASES, ids=ids)
def test_fp32_bits_follow_atens_order(shape, groups):
    torch.manual_seed(0)
    x = torch.randn(*shape) * 3 + 0.5
    weight, bias = torch.randn(shape[1]), torch.randn(shape[1])
    assert gk.supported_layout(x, weight, bias, groups, 1e-6)
    got = gk.group_norm(x, weight, bias, groups, 1e-6)
    want = aten_group_norm_fp32(x, weight, bias, groups, 1e-6)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
def test_silu_and_half_precision_within_rounding(dtype):
    torch.manual_seed(1)
    x = (torch.randn(1, 64, 5, 9) * 2).to(dtype)  # groups of 90 (ATen's 512-thread groups: the fp32 bits test)
    weight, bias = (torch.randn(64) + 1).to(dtype), torch.randn(64).to(dtype)
    for silu in (False, True):
        check(gk.group_norm(x, weight, bias, 32, 1e-6, silu), group_norm_reference(x, weight, bias, 32, 1e-6, silu),
              exact=False, tol=2 ** -6)


def test_the_statistics_spread_over_more_programs_the_fewer_groups_there_are():
    plan = gk._plan(torch.empty(1, 128, 1024, 1024, device="meta"), 32)
    assert plan["threads"] == 512 and plan["rows"] * plan["split"] >= 2 * gk.SM_COUNT and plan["lanes"] >= 32
    small = gk._plan(torch.empty(1, 64, 2, 2, device="meta"), 32)
    assert small["threads"] == 32 and small["split"] == 1


def test_what_the_kernels_take():
    x, w = torch.randn(1, 64, 4, 4), torch.randn(64)
    assert gk.supported_layout(x, w, w, 32, 1e-6)
    assert not gk.supported_layout(x, None, None, 32, 1e-6)  # no affine: another formula
    assert not gk.supported_layout(x, w, w, 48, 1e-6)  # groups do not divide the channels
    assert not gk.supported_layout(torch.randn(1, 64, 1), w, w, 32, 1e-6)  # HxW = 1: ATen's 1-d path
    assert not gk.supported_layout(x.transpose(2, 3), w, w, 32, 1e-6)
    assert not gk.supported_layout(x, w.double(), w, 32, 1e-6)


PRE_BIAS_CASES = [  # (shape, groups): whole batches (L >= 16 x 512) crossing at most one channel boundary
    ((1, 2, 80, 128), 1), ((1, 4, 48, 48), 1), ((2, 16, 4, 6), 8),  # (HW >= 16 x 512), more; a tail alone
]


@pytest.mark.parametrize("shape,groups", PRE_BIAS_CASES, ids=ids)
def test_a_convolutions_bias_added_on_read_is_the_biased_maps_norm(shape, groups):
    """sgdiff::conv_group_norm's kernels on the bias-free map and the bias: the norm of the
    biased map (fp32: the bias add rounds to fp32 either way), bit for bit, with the SiLU."""
    torch.manual_seed(2)
    y = torch.randn(*shape) * 2
    conv_bias, weight, bias = torch.randn(shape[1]), torch.randn(shape[1]) + 1, torch.randn(shape[1])
    biased = y + conv_bias[:, None, None]
    got = gk._bind_pre_biased(y, conv_bias, weight, bias, groups, 1e-6, True)(y, conv_bias, weight, bias)
    want = gk.bind(biased, weight, bias, groups, 1e-6, True)(biased, weight, bias)
    assert torch.equal(got, want), (got - want).abs().max()
    got = gk._bind_pre_biased(y, conv_bias, weight, bias, groups, 1e-6)(y, conv_bias, weight, bias)
    assert torch.equal(got, aten_group_norm_fp32(biased, weight, bias, groups, 1e-6))


def test_a_group_whose_division_is_flagged_is_folded_again_with_ieee_division():
    """Values so small that ``delta / n`` falls below fp32's normal range: the fast division is
    flagged and the group's fold redone; the bits stay ATen's order's (torch's division)."""
    torch.manual_seed(3)
    x = torch.randn(1, 4, 64, 64)  # two groups of 8192: a whole batch each, folded fast first
    x[0, :2] *= 2.0 ** -120  # the first group's values: about 1e-36
    weight, bias = torch.randn(4) + 1, torch.randn(4)
    got = gk.group_norm(x, weight, bias, 2, 1e-6)
    want = aten_group_norm_fp32(x, weight, bias, 2, 1e-6)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("shape", [(1, 64, 5, 9), (1, 96, 3, 5, 7), (1, 32, 1, 33)], ids=ids)
def test_a_channels_last_output_holds_the_contiguous_ones_bits(shape):
    """``channels_last``: the apply's tiles write the output channels-last (C not a multiple of
    the tile's 64 channels, positions not of its width): the contiguous output's values, bit for
    bit, in channels-last strides; with a convolution's bias added on read too, and from a
    channels-last bias-free map (the bias's pass writing it contiguous for the statistics)."""
    torch.manual_seed(4)
    x = torch.randn(*shape) * 2
    weight, bias = torch.randn(shape[1]) + 1, torch.randn(shape[1])
    last = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    for silu in (False, True):
        want = gk.group_norm(x, weight, bias, 32, 1e-6, silu)
        got = gk.group_norm(x, weight, bias, 32, 1e-6, silu, True)
        assert got.is_contiguous(memory_format=last) and torch.equal(got, want)
    conv_bias = torch.randn(shape[1])
    want = gk.bind(x + conv_bias.reshape(-1, *[1] * (len(shape) - 2)), weight, bias, 32, 1e-6, True)
    want = want(x + conv_bias.reshape(-1, *[1] * (len(shape) - 2)), weight, bias)
    for y in (x, x.contiguous(memory_format=last)):
        got = gk._bind_pre_biased(y, conv_bias, weight, bias, 32, 1e-6, True, True)(y, conv_bias, weight, bias)
        assert got.is_contiguous(memory_format=last) and torch.equal(got, want)


def test_a_channels_last_output_is_asked_of_maps_that_have_one():
    x, w = torch.randn(1, 64, 4, 4), torch.randn(64)
    assert gk.supported_layout(x, w, w, 32, 1e-6, True, True)
    assert not gk.supported_layout(torch.randn(1, 64, 16), w, w, 32, 1e-6, True, True)  # 3-d: no such format
    conv_w, conv_b, geometry = torch.randn(64, 64, 3, 3), torch.randn(64), ([1, 1], [1, 1], [1, 1], 1)
    last = x.contiguous(memory_format=torch.channels_last)
    assert gk.conv_supported_layout(last, conv_w, conv_b, *geometry, w, w, 32, 1e-6, True, False, True)
    assert not gk.conv_supported_layout(last, conv_w, conv_b, *geometry, w, w, 32, 1e-6, True)  # eager's layout
