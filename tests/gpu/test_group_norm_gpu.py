"""sgdiff::group_norm on the GPU: the kernels' bits against ATen's GroupNorm (+ SiLU) over shapes,
dtypes, groups and batch, and a VAE decode through sgdiff equal to eager with them running."""
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch
from sgdiff.kernels.triton import group_norm as gk
from sgdiff.kernels.triton.cuda_math import count_reciprocal

pytestmark = pytest.mark.gpu


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), groups=st.sampled_from([1, 4, 8, 32]), per_group=st.integers(1, 8),
       hw=st.sampled_from([(1, 2), (3, 5), (8, 8), (16, 33), (64, 64), (128, 96), (2, 8, 8)]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), silu=st.booleans(),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_bits_equal_atens(n, groups, per_group, hw, dtype, silu, scale):
    c = groups * per_group
    x = (torch.randn(n, c, *hw, device="cuda") * scale + 0.5).to(dtype)
    weight = (torch.randn(c, device="cuda") + 1).to(dtype)
    bias = torch.randn(c, device="cuda").to(dtype)
    assert gk.can_use(x, weight, bias, groups, 1e-6, silu)
    want = F.group_norm(x, groups, weight, bias, 1e-6)
    want = F.silu(want) if silu else want
    got = gk.group_norm(x, weight, bias, groups, 1e-6, silu)
    diff = dispatch._first_difference(got, want)
    assert diff is None, diff


def test_a_vae_decode_is_equal_to_eager_with_the_kernels():
    from sgdiff import zoo

    dispatch.reset()
    torch._dynamo.reset()
    vae = zoo._flux_vae("full").to("cuda", torch.bfloat16).eval().requires_grad_(False)
    z = torch.randn(1, 16, 32, 32, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(vae.decode, backend="sgdiff", options={"families": ("group_norm",)})
    with torch.no_grad():
        for _ in range(4):  # warm-up, capture, replays
            assert torch.equal(compiled(z, return_dict=False)[0], vae.decode(z, return_dict=False)[0])
    assert not dispatch.disabled()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_statistics_rounding_found_is_atens_and_the_other_is_not(dtype):
    """torch 2.11's GroupNorm reads mean and rstd back in the input's dtype; later builds keep
    fp32: the probe's answer gives ATen's bits at a VAE shape, the other answer does not."""
    x = (torch.randn(1, 512, 64, 64, device="cuda") * 2 + 0.3).to(dtype)
    weight, bias = (torch.randn(512, device="cuda") + 1).to(dtype), torch.randn(512, device="cuda").to(dtype)
    want = F.group_norm(x, 32, weight, bias, 1e-6)
    found = gk.stats_rounded(x.device)
    assert torch.equal(gk.bind(x, weight, bias, 32, 1e-6, round_stats=found)(x, weight, bias), want)
    assert not torch.equal(gk.bind(x, weight, bias, 32, 1e-6, round_stats=not found)(x, weight, bias), want)


@triton.jit
def _divisions(delta_ptr, out_ptr, n_lo, N: tl.constexpr, BLOCK: tl.constexpr):
    """Every delta of a block divided by each count n_lo .. n_lo + N - 1: the statistics' fast
    division and div.rn, their bits' difference stored (0: equal)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    delta = tl.load(delta_ptr + i)
    differ = tl.zeros([BLOCK], tl.int32)
    for k in range(N):
        n = tl.full([BLOCK], 0.0, tl.float32) + (n_lo + k).to(tl.float32)
        fast = gk.div_count(delta, n, count_reciprocal(n))
        differ += (fast.to(tl.int32, bitcast=True) != tl.math.div_rn(delta, n).to(tl.int32, bitcast=True)).to(tl.int32)
    tl.store(out_ptr + i, differ)


@pytest.mark.parametrize("n_lo", [1, 4093, 65000, 2 ** 24 - 4096])
def test_the_fast_division_is_ieee_division_in_the_range_it_is_not_flagged(n_lo):
    """2**22 deltas (every exponent from 2**-90 to 2**126, random mantissas, both signs, and the
    bf16 values' differences a VAE map makes) against 4096 counts each: no bit differs."""
    g = torch.Generator(device="cuda").manual_seed(n_lo)
    mantissa = torch.rand(2 ** 22, device="cuda", generator=g) + 1.0
    exponent = torch.randint(-90, 126, (2 ** 22,), device="cuda", generator=g).float()
    sign = torch.randint(0, 2, (2 ** 22,), device="cuda", generator=g).float() * 2 - 1
    delta = sign * mantissa * torch.exp2(exponent)
    delta[: 2 ** 20] = (torch.randn(2 ** 20, device="cuda", generator=g) * 3).bfloat16().float() - 0.3712
    differ = torch.empty(2 ** 22, dtype=torch.int32, device="cuda")
    _divisions[(2 ** 22 // 1024,)](delta, differ, n_lo, N=4096, BLOCK=1024)
    assert int(differ.sum()) == 0
