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
