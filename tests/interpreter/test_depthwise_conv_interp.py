"""The depthwise convolution + GLU kernel (conv_silu_mul's depthwise variant) under the
interpreter, against the chain's arithmetic in torch: the filter's taps summed in fp32 in
row-major order, rounded, the bias added and rounded, silu of the second half rounded, times the
first half. The interpreter truncates fp32 to bf16 where the GPU rounds to nearest, so the
torch side truncates too and the bits must agree (a wrong tap, stride or half shows; the order
of the fp32 sum seldom does once truncated to bf16). Against cuDNN's bits, the order included:
tests/gpu/test_depthwise_conv_gpu.py."""
import pytest
import torch
import torch.nn.functional as F

from sgdiff.kernels.triton import depthwise_conv as dw
from sgdiff.kernels.triton.conv_bias import conv_spatial_size

pytestmark = pytest.mark.interpreter


def truncated(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as the interpreter rounds (truncation), kept in fp32."""
    return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


def chain_truncated(x, w, b, stride, padding, dilation):
    C, (KH, KW) = x.shape[1], w.shape[2:]
    Ho, Wo = conv_spatial_size(x, w, stride, padding, dilation)
    xp = F.pad(x.float(), (padding[1], padding[1], padding[0], padding[0]))
    acc = torch.zeros(x.shape[0], C, Ho, Wo)
    for i, j in [(i, j) for i in range(KH) for j in range(KW)]:
        h0, w0 = i * dilation[0], j * dilation[1]
        tap = xp[:, :, h0:h0 + (Ho - 1) * stride[0] + 1:stride[0], w0:w0 + (Wo - 1) * stride[1] + 1:stride[1]]
        acc = acc + tap * w[:, 0, i, j].float().view(1, C, 1, 1)
    y = truncated(truncated(acc) + b.float().view(1, C, 1, 1))
    a, g = y.chunk(2, 1)
    return truncated(truncated(F.silu(g)) * a)


CASES = [  # B, C, H, W, filter, padding, stride, dilation, channels-last
    (2, 8, 5, 7, 3, 1, 1, 1, True),
    (1, 140, 9, 4, 5, 2, 2, 1, False),  # channels past a tile, a stride of 2, contiguous
    (1, 4, 6, 6, 3, 2, 1, 2, True),  # dilated
    (3, 6, 11, 3, 3, 0, 1, 1, True),  # no padding: a smaller map
    (2, 6, 20, 5, 3, 1, 1, 1, True),  # the three-row kernel's strips past the last row
    (1, 6, 4, 6, 3, 2, 1, 1, True),  # padded by 2: input rows that serve no output row
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_taps_in_row_major_order_then_the_glu(case):
    B, C, H, W, k, pad, stride, dil, last = case
    torch.manual_seed(0)
    x = torch.randn(B, H, W, C).to(torch.bfloat16).permute(0, 3, 1, 2)
    x = x if last else x.contiguous()
    w, b = (torch.randn(C, 1, k, k) / k).to(torch.bfloat16), torch.randn(C).to(torch.bfloat16)
    geometry = ([stride] * 2, [pad] * 2, [dil] * 2, C)
    assert dw.supported_layout(x, w, b, *geometry)
    want = chain_truncated(x, w, b, *geometry[:3])
    variants = dw.variants(x, w, b, *geometry)
    assert any("3-row" in label for label, _ in variants) == (k == 3 and stride == dil == 1)
    for label, launch in variants if case in CASES[1:4] else variants[:1] + variants[-1:]:
        got = launch(x, w, b, *geometry)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        # eager's layout: channels-last from a channels-last map
        assert got.is_contiguous(memory_format=torch.channels_last if last else torch.contiguous_format)
        assert torch.equal(got.float(), want), (label, (got.float() - want).abs().max())


def test_what_the_kernel_takes():
    x = torch.randn(2, 8, 6, 6).to(torch.bfloat16)
    w, b = torch.randn(8, 1, 3, 3).to(torch.bfloat16), torch.randn(8).to(torch.bfloat16)
    g = ([1, 1], [1, 1], [1, 1], 8)
    assert dw.supported_layout(x, w, b, *g)
    assert dw.supported_layout(x.contiguous(memory_format=torch.channels_last), w, b, *g)
    assert not dw.supported_layout(x.float(), w.float(), b.float(), *g)  # fp32: not cuDNN's 16-bit kernel
    assert not dw.supported_layout(x, w, None, *g)  # no bias
    assert not dw.supported_layout(x, w[:, :, :, :2].contiguous(), b, [1, 1], [1, 1], [1, 1], 4)  # not depthwise
    assert not dw.supported_layout(x[:, :7], w[:7], b[:7], [1, 1], [1, 1], [1, 1], 7)  # no two halves
    assert not dw.supported_layout(x, w.transpose(2, 3), b, *g)  # a filter read transposed
    assert not dw.supported_layout(x.transpose(2, 3), w, b, *g)  # neither contiguous nor channels-last
    assert not dw.supported_layout(x, torch.randn(8, 1, 8, 8).to(torch.bfloat16), b, [1, 1], [4, 4], [1, 1], 8)
    assert not dw.supported_layout(x, w, b, [1, 1], [0, 0], [4, 4], 8)  # no output pixel
