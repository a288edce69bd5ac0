"""sgdiff::upsample_nearest's and sgdiff::biased_conv's passes under the interpreter: the doubling
is a copy (every dtype bit for bit, contiguous or channels-last out); the bias's pass over a
channels-last convolution output writes eager's contiguous map."""
import pytest
import torch

from sgdiff.kernels.triton import biased_conv as kb, upsample_nearest as ku
from sgdiff.kernels.upsample_nearest import upsample_nearest_reference
from tests.interpreter.common import FP32_BF16, check, ids

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
@pytest.mark.parametrize("shape", [(1, 8, 5, 7), (2, 70, 3, 40)], ids=ids)
def test_the_doubling_copies_eagers_bits(shape, dtype):
    x = torch.randn(*shape).to(dtype)
    size = [2 * shape[2], 2 * shape[3]]
    for channels_last in (False, True):
        want = upsample_nearest_reference(x, size, 2.0, 2.0, channels_last)
        check(ku.upsample_nearest(x, size, 2.0, 2.0, channels_last), want, exact=True)


def test_what_the_doubling_takes():
    x = torch.randn(1, 4, 6, 8)
    assert ku.supported_layout(x, [12, 16], None, None) and ku.supported_layout(x, [12, 16], 2.0, 2.0, True)
    assert not ku.supported_layout(x, [18, 24], 3.0, 3.0)  # not doubled
    assert not ku.supported_layout(x, [12, 16], 2.0, 2.5)  # another scale: another source index
    assert not ku.supported_layout(x.contiguous(memory_format=torch.channels_last), [12, 16])


@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
def test_the_bias_pass_writes_a_channels_last_output_contiguous(dtype):
    y = torch.randn(1, 72, 9, 11).to(dtype).contiguous(memory_format=torch.channels_last)
    bias = torch.randn(72).to(dtype)
    check(kb.bind_epilogue(y, bias, True)(y, bias, True), (y + bias[:, None, None]).contiguous(),
          exact=dtype == torch.float32)
