"""sgdiff::cat_pad's Triton kernel under the interpreter against the chain it replaces: a copy,
so every case is compared bit for bit (and stride for stride) — any dtype, 1 to 5 dims, the cat
along each dim, pads positive, zero and negative (a crop), inputs strided."""
import pytest
import torch

from sgdiff.kernels.cat_pad import cat_pad_reference
from sgdiff.kernels.triton import cat_pad as ck
from tests.interpreter.common import check, ids

pytestmark = pytest.mark.interpreter

CASES = [  # (a's shape, b's shape, dim, pad)
    ((1, 3, 2, 5, 7), (1, 3, 1, 5, 7), 2, [1, 1, 1, 1, 0, 0]),     # Wan's causal conv: 2 cached frames + 1
    ((1, 3, 1, 5, 7), (1, 3, 1, 5, 7), 2, [1, 1, 1, 1, 1, 0]),     # 1 cached frame, padded in time too
    ((2, 3, 4), (2, 5, 4), 1, [2, 0, 0, 3]),                       # 3-d, the cat along channels
    ((4, 6), (4, 3), -1, [1, 2]),                                  # the cat along the padded last dim
    ((3, 2, 5, 7), (1, 2, 5, 7), 0, [-1, 2, 0, 0, 1, 1]),          # a crop on one side, batch cat
    ((9,), (4,), 0, [0, 0]),                                       # 1-d, no pad at all
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=ids)
@pytest.mark.parametrize("shape_a,shape_b,dim,pad", CASES)
def test_bits_are_the_chains(shape_a, shape_b, dim, pad, dtype):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g).to(dtype) for s in (shape_a, shape_b))
    assert ck.supported_layout(a, b, dim, pad, 0.0)
    check(ck.cat_pad(a, b, dim, pad, -1.5), cat_pad_reference(a, b, dim, pad, -1.5), exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ids)
def test_a_pad_alone(dtype):
    """Without ``b``: the pad of ``a`` (Wan's first chunk), a strided ``a`` too."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(1, 3, 1, 5, 7, generator=g).to(dtype)
    for x in (a, a.transpose(3, 4)):
        check(ck.cat_pad(x, None, 0, [1, 1, 1, 1, 2, 0], 0.0), cat_pad_reference(x, None, 0, [1, 1, 1, 1, 2, 0], 0.0),
              exact=True)


def test_strided_inputs_and_a_value_rounded_to_the_dtype():
    """Inputs read where they lie (a transposed view, a slice); the pad value rounded to bf16 as
    ATen's fill_ rounds it."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(1, 7, 2, 3, 5, generator=g).to(torch.bfloat16).transpose(1, 3)  # [1, 3, 2, 7, 5]
    b = torch.randn(1, 3, 6, 7, 5, generator=g).to(torch.bfloat16)[:, :, 2:5]
    pad = [1, 1, 2, 0, 1, 0]
    check(ck.cat_pad(a, b, 2, pad, 0.1), cat_pad_reference(a, b, 2, pad, 0.1), exact=True)


def test_what_the_kernel_refuses():
    x = torch.randn(2, 3)
    assert not ck.supported_layout(x, torch.randn(2, 3).double(), 0, [1, 1], 0.0)  # mixed dtypes
    assert not ck.supported_layout(x, torch.randn(2, 4), 0, [1, 1], 0.0)           # sizes differ off the cat dim
    assert not ck.supported_layout(torch.randn(1, 1, 1, 1, 1, 2), torch.randn(1, 1, 1, 1, 1, 2), 0, [1, 1], 0.0)
    assert not ck.supported_layout(x, x, 0, [-2, -2], 0.0)                          # an empty output
