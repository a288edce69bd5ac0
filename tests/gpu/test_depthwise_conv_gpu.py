"""conv_silu_mul's depthwise kernel on CUDA: a 3x3 depthwise convolution of a 16-bit map, its taps
summed in row-major order, then the bias and the GLU, bitwise equal to eager's chain (cuDNN's
convolution, ATen's bias add, the chunk and ``a * silu(g)``) in every tiling; other geometries through the op
(first sight keeps only what gives eager's bits); Sana's GLUMBConv compiled."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from sgdiff.kernels import dispatch
from sgdiff.kernels.triton import conv_silu as tconv, depthwise_conv as dw
from sgdiff.kernels.triton.conv_bias import conv_spatial_size
from tests.helpers import eager_and_compiled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def operands(B, C, H, W, k, dtype, channels_last=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, H, W, C, device="cuda", generator=g).to(dtype).permute(0, 3, 1, 2)
    x = x if channels_last else x.contiguous()
    w = (torch.randn(C, 1, k, k, device="cuda", generator=g) / k).to(dtype)
    return x, w, torch.randn(C, device="cuda", generator=g).to(dtype)


def chain(x, w, b, stride, padding, dilation, groups):
    a, g = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups).chunk(2, 1)
    return a * F.silu(g)


@pytest.mark.parametrize("shape", [(2, 11200, 32, 32), (1, 11200, 64, 64), (2, 640, 33, 47), (1, 6, 5, 3),
                                   (3, 130, 17, 9)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_tiling_gives_cudnns_bits(shape, dtype):
    x, w, b = operands(*shape, 3, dtype)
    geometry = ([1, 1], [1, 1], [1, 1], shape[1])
    assert tconv.on_cudnn(x, w, b, *geometry) and dw.supported_layout(x, w, b, *geometry)
    want = chain(x, w, b, *geometry)
    variants = dw.variants(x, w, b, *geometry)
    assert any("3-row" in label for label, _ in variants)
    for label, fn in variants:
        got = fn(x, w, b, *geometry)
        assert got.stride() == want.stride(), label
        assert dispatch._first_difference(got, want) is None, label


@given(B=st.integers(1, 3), half=st.integers(1, 200), H=st.integers(1, 40), W=st.integers(1, 40),
       k=st.sampled_from([3, 5]), stride=st.sampled_from([1, 2]), pad=st.integers(0, 2),
       channels_last=st.booleans(), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_the_op_is_eagers_chain_at_any_geometry(B, half, H, W, k, stride, pad, channels_last, dtype):
    """Through dispatch: first sight keeps the depthwise kernel only where its bits are cuDNN's
    (another filter size or stride may take another cuDNN kernel); the output is eager's."""
    x, w, b = operands(B, 2 * half, H, W, k, dtype, channels_last)
    geometry = ([stride] * 2, [pad] * 2, [1, 1], 2 * half)
    if min(conv_spatial_size(x, w, *geometry[:3])) <= 0:
        return
    want = chain(x, w, b, *geometry)
    got = dispatch.run("conv_silu_mul", x, w, b, *geometry)
    assert got.stride() == want.stride() and dispatch._first_difference(got, want) is None
    again = dispatch.run("conv_silu_mul", x, w, b, *geometry)  # the settled choice
    assert dispatch._first_difference(again, want) is None


def test_sanas_glumbconv_compiled(fresh_dispatch):
    from diffusers.models.transformers.sana_transformer import GLUMBConv

    torch.manual_seed(0)
    ff = GLUMBConv(2240, 2240, expand_ratio=2.5, norm_type=None, residual_connection=False).to("cuda", torch.bfloat16).eval()
    x = torch.randn(2, 1024, 2240, device="cuda", dtype=torch.bfloat16)

    def feed_forward(x):
        return ff(x.unflatten(1, (32, 32)).permute(0, 3, 1, 2)).flatten(2).transpose(1, 2)

    want, got = eager_and_compiled(feed_forward, x)
    assert torch.equal(got, want)
    chosen = {op: (choice, times) for op, _, choice, times in dispatch.first_sight_report() if op == "conv_silu_mul"}
    print("first sight:", chosen)  # which way each conv_silu_mul signature took, in us
    assert chosen and all(choice.startswith("triton depthwise") for choice, _ in chosen.values()), chosen
