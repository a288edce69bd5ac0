"""A matmul of a 3-D tensor by a matrix that the traced graph folds into one mm where eager
batches it (a slice whose size-1 dims' strides do not nest: ConsisID's face extractor): the
graph gets eager's bmm, and the output is eager's bits; what eager folds stays an mm."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from sgdiff.fxpasses.matmul_fold import aten_folds, batch_folded_matmuls
from tests.capture import capture
from tests.helpers import bits_equal, count_op

aten = torch.ops.aten


def sliced_matmul(lat, w):
    return lat[:, :1] @ w  # [B, 1, k]: a slice of the tokens


def _graph(fn, args):
    gm = capture(fn, args, False)
    return gm, batch_folded_matmuls(gm)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(2, 5), k=st.sampled_from([2, 8, 33]), p=st.sampled_from([1, 16]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_a_folded_matmul_that_eager_batches_is_a_bmm(B, T, k, p, dtype):
    g = torch.Generator().manual_seed(B * 100 + T)
    lat, w = torch.randn(B, T, k, generator=g).to(dtype), torch.randn(k, p, generator=g).to(dtype)
    gm, count = _graph(sliced_matmul, (lat, w))
    batched = not aten_folds(lat[:, :1], w)  # eager's own choice
    traced_mm = count_op(capture(sliced_matmul, (lat, w), False), aten.mm.default) == 1  # the graph folded it
    assert count == int(batched and traced_mm)
    assert count_op(gm, aten.mm.default) == 0 or not batched
    got, want = gm(lat, w)[0], sliced_matmul(lat, w)
    assert bits_equal(got, want) and got.shape == want.shape


def test_consisid_slice_is_batched():
    lat, w = torch.randn(1, 3, 8), torch.randn(8, 16)
    assert not aten_folds(lat[:, :1], w)  # strides (24, 8, 1): 24 != 8 * 1
    gm, count = _graph(sliced_matmul, (lat, w))
    assert count == 1 and count_op(gm, aten.bmm.default) == 1 and count_op(gm, aten.mm.default) == 0


@pytest.mark.parametrize("name,fn", [
    ("contiguous tokens: eager folds", lambda lat, w: lat @ w),
    ("the model's own reshape and mm", lambda lat, w: (lat[:, :1].reshape(-1, 8) @ w).view(1, 1, 16)),
])
def test_what_eager_folds_stays_an_mm(name, fn):
    lat, w = torch.randn(1, 3, 8), torch.randn(8, 16)
    gm, count = _graph(fn, (lat, w))
    assert count == 0 and count_op(gm, aten.mm.default) == 1, name
    assert bits_equal(gm(lat, w)[0], fn(lat, w))


def test_a_weight_that_requires_grad_is_folded_by_eager_too():
    lat, w = torch.randn(1, 3, 8), torch.randn(8, 16, requires_grad=True)
    assert aten_folds(lat[:, :1], w)
