"""sgdiff::channel_normalize's Triton kernel under the interpreter against the chain it replaces
(its reference): fp32 without the SiLU bit for bit (a clamp, an IEEE division, products and a
sum, each rounded to fp32 as the GPU rounds them); the SiLU and bf16 within a tolerance (the
interpreter's expf and bf16 rounding are not the GPU's). The bits against ATen itself:
tests/gpu/test_examples_gpu.py at the decoder's real sizes, and the model test there."""
import pytest
import torch

from sgdiff.kernels.channel_normalize import channel_normalize_reference
from sgdiff.kernels.triton import channel_normalize as ck
from tests.interpreter.common import check, ids

pytestmark = pytest.mark.interpreter

CASES = [  # (x's shape, gamma's shape, a tensor bias, stored frame-major)
    ((1, 8, 2, 6, 10), (8, 1, 1, 1), False, False),   # Wan's decoder: a video map, bias 0.0
    ((2, 5, 3, 7), (5, 1, 1), True, False),           # an image map (images=True), a bias a channel, batch 2
    ((1, 3, 33), (3, 1), False, False),               # 3-d, a tail of positions
    ((2, 6, 3, 5, 9), (6, 1, 1, 1), False, True),     # Wan's map after a spatial upsampling: [b, t, c, h, w]
]                                                     # permuted to [b, c, t, h, w], batch 2


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("shape,gamma_shape,tensor_bias,frame_major", CASES)
def test_the_chain_after_the_norm(shape, gamma_shape, tensor_bias, frame_major, dtype, silu):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    x.view(-1)[:3] = 0  # a zero (and a norm clamped, where a whole column is zero)
    if frame_major:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    norm = torch.linalg.vector_norm(x.float(), 2, [1], True)
    gamma = (1 + 0.1 * torch.randn(gamma_shape, generator=g)).to(dtype)
    bias = torch.randn(gamma_shape, generator=g).to(dtype) if tensor_bias else None
    args = (x, norm, 1e-12, shape[1] ** 0.5, gamma, bias, 0.0 if tensor_bias else 0.5, silu)
    assert ck.supported_layout(*args)
    # bf16: five roundings, each truncated by the interpreter, so a few ulps; eager's strides
    check(ck.channel_normalize(*args), channel_normalize_reference(*args), exact=dtype == torch.float32 and not silu,
          tol=2 ** -4)


def test_a_scale_tensor_is_read_at_each_call():
    """The scale as a graph input (a 0-d fp32 host tensor): one bound launch serves two values."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 6, 2, 4, 5, generator=g)
    norm = torch.linalg.vector_norm(x, 2, [1], True)
    gamma = 1 + 0.1 * torch.randn(6, 1, 1, 1, generator=g)
    args = (x, norm, 1e-12, 1.0, gamma, None, 0.0, False)
    launch = ck.bind(*args, torch.tensor(6 ** 0.5))
    for value in (6 ** 0.5, 3 ** 0.5):
        scale = torch.tensor(value)
        assert ck.supported_layout(*args, scale)
        check(launch(*args, scale), channel_normalize_reference(*args, scale), exact=True)
    assert not ck.supported_layout(*args, torch.tensor(2.0, dtype=torch.float64))  # not fp32
    assert not ck.supported_layout(*args, torch.tensor([2.0]))                     # not 0-d


def test_what_the_kernel_refuses():
    x, gamma = torch.randn(1, 4, 3, 5), torch.ones(4, 1, 1)
    norm = torch.linalg.vector_norm(x, 2, [1], True)
    assert ck.supported_layout(x, norm, 1e-12, 2.0, gamma)
    assert not ck.supported_layout(x.transpose(2, 3), norm.transpose(2, 3), 1e-12, 2.0, gamma)  # a frame strided
    assert not ck.supported_layout(x[..., :4], norm[..., :4], 1e-12, 2.0, gamma)               # not dense
    assert not ck.supported_layout(x, norm.double(), 1e-12, 2.0, gamma)                        # the norm not fp32
    assert not ck.supported_layout(x, norm, 1e-12, 2.0, torch.ones(1, 4, 1))                   # gamma not [C, ...]
    assert not ck.supported_layout(x, norm, 1e-12, 2.0, gamma.bfloat16())                      # gamma's dtype
