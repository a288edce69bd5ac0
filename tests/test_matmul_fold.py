"""A matmul of a 3-D tensor by a matrix that the traced graph folds into one mm where eager may
batch it (a slice whose size-1 dims' strides do not nest: ConsisID's face extractor): the graph
calls ATen's matmul itself, which decides at run time as eager does (a weight that requires grad
folds), and the output is eager's bits; what eager always folds stays an mm."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from sgdiff.fxpasses.matmul_fold import restore_matmul_folding, strides_nest
from tests.capture import capture
from tests.helpers import bits_equal, count_op

aten = torch.ops.aten


def sliced_matmul(lat, w):
    return lat[:, :1] @ w  # [B, 1, k]: a slice of the tokens


def _graph(fn, args):
    gm = capture(fn, args, False)
    return gm, restore_matmul_folding(gm)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(2, 5), k=st.sampled_from([2, 8, 33]), p=st.sampled_from([1, 16]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_a_folded_matmul_eager_may_batch_is_atens_matmul(B, T, k, p, dtype):
    g = torch.Generator().manual_seed(B * 100 + T)
    lat, w = torch.randn(B, T, k, generator=g).to(dtype), torch.randn(k, p, generator=g).to(dtype)
    gm, count = _graph(sliced_matmul, (lat, w))
    # the graph folded it (mm) or batched it (bmm), as this torch's trace decides: where the
    # strides do not nest, either way ATen's matmul decides at run time
    assert count == int(not strides_nest(lat[:, :1]))
    assert count_op(gm, aten.matmul.default) == count
    assert count_op(gm, aten.mm.default) + count_op(gm, aten.bmm.default) == 1 - count
    got, want = gm(lat, w)[0], sliced_matmul(lat, w)
    assert bits_equal(got, want) and got.shape == want.shape


def test_consisid_slice_is_left_to_aten():
    lat, w = torch.randn(1, 3, 8), torch.randn(8, 16)
    assert not strides_nest(lat[:, :1])  # strides (24, 8, 1): 24 != 8 * 1
    gm, count = _graph(sliced_matmul, (lat, w))
    assert count == 1 and count_op(gm, aten.matmul.default) == 1 and count_op(gm, aten.mm.default) == 0


@pytest.mark.parametrize("requires_grad", [False, True])
def test_compiled_module_matches_eager_whether_its_weight_requires_grad(requires_grad):
    """Eager folds when the weight requires grad (a parameter, even under no_grad) and batches
    otherwise; the compiled module does the same in both cases."""
    class FaceOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj_out = torch.nn.Parameter(torch.randn(2, 32), requires_grad=requires_grad)

        def forward(self, lat):
            return lat[:, :1] @ self.proj_out

    torch.manual_seed(0)
    m = FaceOut()
    for _ in range(8):  # a 2-term sum: mm and bmm differ on some inputs only
        lat = torch.randn(1, 3, 2)
        torch._dynamo.reset()
        with torch.no_grad():
            assert bits_equal(torch.compile(m, backend="sgdiff")(lat), m(lat))
    torch._dynamo.reset()


@pytest.mark.parametrize("name,fn", [
    ("contiguous tokens: eager folds", lambda lat, w: lat @ w),
    ("the model's own reshape and mm", lambda lat, w: (lat[:, :1].reshape(-1, 8) @ w).view(1, 1, 16)),
])
def test_what_eager_folds_stays_an_mm(name, fn):
    lat, w = torch.randn(1, 3, 8), torch.randn(8, 16)
    gm, count = _graph(fn, (lat, w))
    assert count == 0 and count_op(gm, aten.mm.default) == 1, name
    assert bits_equal(gm(lat, w)[0], fn(lat, w))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("k", [2, 33])
def test_a_batched_matmul_eager_folds_for_a_parameter_is_atens_matmul(requires_grad, k):
    """x's batch dims transposed (strides that do not nest, no dim of size 1): traced with a weight
    that requires no grad, the graph batches the matmul, and the pass leaves it to ATen's matmul;
    eager batches it too, unless the weight requires grad, then it folds. The compiled module
    matches eager either way."""
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(k, 16), requires_grad=requires_grad)

        def forward(self, x):
            return x.transpose(0, 1) @ self.w

    torch.manual_seed(0)
    m = Head()
    x = torch.randn(5, 3, 4, k)  # [T, B, n, k] -> [B, T, n, k]: strides do not nest
    assert not strides_nest(x.transpose(0, 1))
    gm, count = _graph(lambda x, w: x.transpose(0, 1) @ w, (x, m.w.detach()))
    assert count == 1 and count_op(gm, aten.bmm.default) == 0 and count_op(gm, aten.matmul.default) == 1
    for _ in range(4):
        x = torch.randn(5, 3, 4, k)
        torch._dynamo.reset()
        with torch.no_grad():
            assert bits_equal(torch.compile(m, backend="sgdiff")(x), m(x))
    torch._dynamo.reset()


def test_a_broadcast_x_or_a_batched_w_stays_a_bmm():
    """Only matmul's own batched form of x [*batch, n, k] by a matrix: a batch of matrices (w
    3-D) is a bmm eager runs too."""
    x, w = torch.randn(5, 3, 4, 8).transpose(0, 1), torch.randn(3, 8, 16)
    gm, count = _graph(lambda x, w: x @ w.unsqueeze(1), (x, w))
    assert count == 0 and count_op(gm, aten.matmul.default) == 0
