"""VAE decodes on CUDA through the default call: Flux's AutoencoderKL and Wan 2.1's
AutoencoderKLWan at their real configs (small latents), bitwise equal to eager on every call
(warm-up, capture, replays), each VAE family's Triton kernel verified (a tuned op's: bit-exact at
first sight, so among the candidates timed) and none disabled."""
import pytest
import torch

from sgdiff import zoo
from sgdiff.kernels import dispatch

pytestmark = pytest.mark.gpu
pytest.importorskip("diffusers")


@pytest.mark.parametrize("name,latent,ops", [
    ("flux", (1, 16, 32, 32), {"group_norm", "conv_group_norm", "conv_residual"}),
    ("wan", (1, 16, 3, 16, 24), {"cat_pad", "channel_normalize", "conv_residual"}),
])
def test_decode_is_equal_to_eager_with_the_vae_kernels(name, latent, ops):
    dispatch.reset()
    torch._dynamo.reset()
    vae = (zoo._flux_vae if name == "flux" else zoo._wan_vae)("full").to("cuda", torch.bfloat16)
    vae = vae.eval().requires_grad_(False)
    z = torch.randn(*latent, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(vae.decode, backend="sgdiff")
    with torch.no_grad():
        want = vae.decode(z, return_dict=False)[0]
        for _ in range(4):
            assert torch.equal(compiled(z, return_dict=False)[0], want)
    assert not dispatch.disabled(), dispatch.disabled()
    checked = {key[0] for key in dispatch._verified}
    # a tuned op's kernel that matched at first sight is among the candidates timed there
    checked |= {op for (op, _), (_, timed) in dispatch.tuned_choices().items()
                if any(backend == "triton" for backend, _, _ in timed)}
    assert ops <= checked, (dispatch._verified, dispatch.tuned_choices())


def _channels_last(x):
    return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


@pytest.mark.parametrize("c,out,spatial,padding,divisor", [
    (128, 128, (96, 80), 1, 1.0), (256, 128, (64, 72), 1, None), (512, 512, (32, 32), 1, 2.0),  # Flux's
    (96, 96, (4, 18, 26), 0, None), (192, 192, (3, 12, 20), 0, None),  # Wan's causal 3-D (input padded)
])
def test_channels_last_between_the_kernels_is_eagers_bits(c, out, spatial, padding, divisor):
    """The layouts pass's pieces, each Triton path called directly (first sight would hide a
    mismatch by falling back): the norm written channels-last holds the contiguous norm's bits;
    a convolution of that channels-last map, then the bias's pass (with the residual, or the
    next norm), equals eager's chain on the contiguous map, written in eager's layout."""
    from sgdiff.kernels.conv_group_norm import conv_group_norm_reference
    from sgdiff.kernels.conv_residual import conv_residual_reference
    from sgdiff.kernels.group_norm import group_norm_reference
    from sgdiff.kernels.triton import conv_residual as kr, group_norm as gk

    torch.manual_seed(0)
    dt, k = torch.bfloat16, (3,) * len(spatial)
    x = torch.randn(1, c, *spatial, device="cuda", dtype=dt) * 2
    gamma, beta = torch.randn(c, device="cuda", dtype=dt) + 1, torch.randn(c, device="cuda", dtype=dt)
    h = gk.group_norm(x, gamma, beta, 32, 1e-6, True, True)
    want_h = group_norm_reference(x, gamma, beta, 32, 1e-6, True)
    assert h.stride() == _channels_last(want_h).stride() and torch.equal(h, want_h)
    w = torch.randn(out, c, *k, device="cuda", dtype=dt) * (c * 27) ** -0.5
    b = torch.randn(out, device="cuda", dtype=dt)
    geometry = ([1] * len(spatial), [padding] * len(spatial), [1] * len(spatial), 1)
    want_y = torch.ops.aten.convolution.default(want_h, w, b, *geometry[:3], False, [0] * len(spatial), 1)
    for residual in (torch.randn_like(want_y), _channels_last(torch.randn_like(want_y))):
        args = (h, w, b, *geometry, residual, divisor, False, True)
        assert kr.can_use(*args)
        got, want = kr.conv_residual(*args), conv_residual_reference(want_h, w, b, *geometry, residual, divisor)
        assert got.stride() == want.stride() and torch.equal(got, want)
    if out % 32 == 0:
        gamma2, beta2 = torch.randn(out, device="cuda", dtype=dt) + 1, torch.randn(out, device="cuda", dtype=dt)
        args = (h, w, b, *geometry, gamma2, beta2, 32, 1e-6, True, True, True)
        assert gk.conv_can_use(*args)
        got = gk.conv_group_norm(*args)
        want = conv_group_norm_reference(want_h, w, b, *geometry, gamma2, beta2, 32, 1e-6, True)
        assert got.stride() == _channels_last(want).stride() and torch.equal(got, want)


@pytest.mark.parametrize("c,hw", [(512, (64, 64)), (256, (100, 72)), (96, (9, 33))])
def test_an_upsampled_map_written_channels_last_convolves_to_eagers_bits(c, hw):
    """sgdiff::upsample_nearest writing channels-last, sgdiff::biased_conv reading it: eager's
    interpolation and convolution on the contiguous map, bit for bit, the output contiguous."""
    import torch.nn.functional as F
    from sgdiff.kernels.triton import biased_conv as kb, upsample_nearest as ku

    torch.manual_seed(1)
    x = torch.randn(1, c, *hw, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16) * (9 * c) ** -0.5
    b = torch.randn(c, device="cuda", dtype=torch.bfloat16)
    up = ku.upsample_nearest(x, [2 * hw[0], 2 * hw[1]], 2.0, 2.0, True)
    want_up = F.interpolate(x, scale_factor=2.0, mode="nearest")
    assert up.stride() == _channels_last(want_up).stride() and torch.equal(up, want_up)
    args = (up, w, b, [1, 1], [1, 1], [1, 1], 1, True)
    assert kb.can_use(*args)
    got, want = kb.biased_conv(*args), F.conv2d(want_up, w, b, padding=1)
    assert got.stride() == want.stride() and torch.equal(got, want)


def test_flux_decode_feeds_its_convolutions_channels_last():
    """The default call on Flux's VAE: the ResNet blocks' convolutions and ``conv_out`` read
    channels-last maps written by the norms (first sight verified each: none disabled), the
    output eager's. (Its upsamplings read the residual stream, channels-last in eager after the
    mid block's attention: they stay ATen's, and so do their convolutions.)"""
    dispatch.reset()
    torch._dynamo.reset()
    vae = zoo._flux_vae("full").to("cuda", torch.bfloat16).eval().requires_grad_(False)
    z = torch.randn(1, 16, 24, 24, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = vae.decode(z, return_dict=False)[0]
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
    assert got.stride() == want.stride() and torch.equal(got, want)
    assert not dispatch.disabled(), dispatch.disabled()
    fed = {op for op, backend, sig in dispatch._verified
           if op in ("conv_residual", "conv_group_norm", "biased_conv") and backend == "triton" and sig[0][1][1] == 1}
    assert fed == {"conv_residual", "conv_group_norm", "biased_conv"}, dispatch._verified
