"""sgdiff::conv_residual's epilogue kernel under the interpreter: the bias, the residual and the
division over a bias-free convolution's output, in place, against the chain's arithmetic in
torch (fp32 bit for bit; bf16 within the interpreter's truncating rounding). The bits against
cuDNN and ATen: tests/gpu/test_examples_gpu.py -k conv_residual."""
import pytest
import torch

from sgdiff.kernels.triton import conv_residual as kr
from tests.interpreter.common import FP32_BF16, check, ids

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
@pytest.mark.parametrize("shape,divisor", [((1, 8, 16, 16), 1.0), ((2, 4, 3, 5, 7), None), ((1, 3, 50, 70), 2.0)],
                         ids=ids)
def test_bias_sum_and_division_in_one_pass(shape, divisor, dtype):
    torch.manual_seed(0)
    y, residual = torch.randn(*shape).to(dtype), torch.randn(*shape).to(dtype)
    bias = torch.randn(shape[1]).to(dtype)
    view = bias.reshape(1, -1, *[1] * (len(shape) - 2))
    want = residual + (y + view)
    want = want if divisor is None else want / divisor
    got = kr.bind_epilogue(y, bias, residual, divisor)(y.clone(), bias, residual)
    check(got, want, exact=dtype == torch.float32)


def test_what_the_kernel_takes():
    x, w, b = torch.randn(1, 8, 10, 10), torch.randn(8, 8, 3, 3), torch.randn(8)
    geometry = ([1, 1], [1, 1], [1, 1], 1)
    r = torch.randn(1, 8, 10, 10)
    assert kr.supported_layout(x, w, b, *geometry, r, 1.0)
    assert not kr.supported_layout(x, w, None, *geometry, r)  # no bias to fold
    assert not kr.supported_layout(x, w, b, *geometry, r[:, :, :1])  # a broadcast residual
    assert not kr.supported_layout(x, w, b, *geometry, r.double())  # the sum would promote
    assert not kr.supported_layout(x, w, b, *geometry, r.transpose(2, 3))  # spatial dims not one run
    assert not kr.supported_layout(x.to(memory_format=torch.channels_last), w, b, *geometry, r)  # eager's layout
    assert kr.supported_layout(x.to(memory_format=torch.channels_last), w, b, *geometry, r, None, False, True)
    assert kr.supported_layout(x, w, b, *geometry, r.to(memory_format=torch.channels_last))
    assert not kr.can_use(x, w, b, *geometry, r)  # a CPU convolution: ATen adds the bias elsewhere


@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
@pytest.mark.parametrize("shape,divisor,conv_first", [((1, 72, 9, 11), 2.0, False), ((2, 8, 3, 5, 7), None, True)],
                         ids=ids)
def test_the_strided_pass_writes_eagers_layout(shape, divisor, conv_first, dtype):
    """A channels-last convolution output (its input was channels-last) and a contiguous or
    channels-last residual: the chain's values in the layout eager's sum has (contiguous where
    the residual is, as the residual where eager's operand order says so)."""
    torch.manual_seed(1)
    last = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    y = torch.randn(*shape).to(dtype)
    bias = torch.randn(shape[1]).to(dtype)
    view = bias.reshape(1, -1, *[1] * (len(shape) - 2))
    for residual in (torch.randn(*shape).to(dtype), torch.randn(*shape).to(dtype).contiguous(memory_format=last)):
        biased = y + view
        want = biased + residual if conv_first else residual + biased
        want = want if divisor is None else want / divisor
        for y_in in (y.contiguous(memory_format=last), y):
            if y_in.is_contiguous() and residual.is_contiguous():
                continue
            got = kr.bind_epilogue(y_in, bias, residual, divisor, conv_first)(y_in.clone(), bias, residual)
            check(got, want, exact=dtype == torch.float32)
