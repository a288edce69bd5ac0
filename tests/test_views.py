"""fxpasses.views: a view taken twice with the same arguments is one node; nothing else merges."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from sgdiff.fxpasses.views import merge_same_views
from tests.helpers import count_op

aten = torch.ops.aten


def _graph(fn, *args):
    return make_fx(fn)(*args)


def test_the_same_view_taken_twice_is_one_node():
    def fn(x, y):
        return x[..., 0::2] * y[..., 0::2] + x[..., 0::2], x[..., 1::2].t()

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    gm = _graph(fn, x, y)
    assert count_op(gm, aten.slice.Tensor) == 4  # x's [0::2] twice, y's, x's [1::2]
    want = fn(x, y)
    assert merge_same_views(gm) == 1 and count_op(gm, aten.slice.Tensor) == 3
    assert all(torch.equal(a, b) for a, b in zip(gm(x, y), want))


def test_other_ops_and_other_arguments_stay():
    def fn(x):
        a, b = x * 2.0, x * 2.0  # the same computation twice: not a view, not merged
        return a + b, x[..., 0::2] + x[..., 1::2], x[0] + x[1]

    x = torch.randn(4, 6)
    gm = _graph(fn, x)
    before = {t: count_op(gm, t) for t in (aten.mul.Tensor, aten.select.int)}
    assert merge_same_views(gm) == 0
    assert {t: count_op(gm, t) for t in before} == before
    assert all(torch.equal(a, b) for a, b in zip(gm(x), fn(x)))


def test_a_graph_that_mutates_in_place_is_left_as_it_is():
    """``v.unsqueeze_(0)`` changes one view's sizes between the two takes: nothing merges."""
    def fn(x):
        v = x[..., 0::2]
        v.unsqueeze_(0)
        return v.sum(), x[..., 0::2] * 2

    x = torch.randn(4, 6)
    gm = _graph(fn, x)
    before = count_op(gm, aten.slice.Tensor)
    assert merge_same_views(gm) == 0 and count_op(gm, aten.slice.Tensor) == before
    assert all(torch.equal(a, b) for a, b in zip(gm(x.clone()), fn(x.clone())))
