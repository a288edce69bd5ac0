"""fxpasses.repeated: a deterministic chain computed twice from the same tensors is kept once,
where the first result is still alive at the second; random ops, unset memory and in-place
graphs stay as they are."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from sgdiff.fxpasses.repeated import merge_repeated
from sgdiff.fxpasses.views import merge_same_views
from tests.helpers import count_op

aten = torch.ops.aten


def _graph(fn, *args):
    gm = make_fx(fn)(*args)
    merge_same_views(gm)  # as the pass manager runs them
    return gm


def _rotate(x, sin):
    """A rotate-half RoPE's second product, as Cosmos 3 writes it for one tensor under two names."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def test_a_chain_computed_twice_is_one_chain():
    def fn(x, sin, y):
        a = _rotate(x, sin)
        b = _rotate(x, sin)
        return a @ y, b + 1.0

    x, sin, y = torch.randn(3, 8), torch.randn(8), torch.randn(8, 8)
    gm = _graph(fn, x, sin, y)
    assert (count_op(gm, aten.neg.default), count_op(gm, aten.cat.default), count_op(gm, aten.mul.Tensor)) == (2, 2, 2)
    want = fn(x, sin, y)
    assert merge_repeated(gm) == 1
    assert (count_op(gm, aten.neg.default), count_op(gm, aten.cat.default), count_op(gm, aten.mul.Tensor)) == (1, 1, 1)
    assert all(torch.equal(a, b) for a, b in zip(gm(x, sin, y), want))


def test_a_value_recomputed_after_its_last_read_stays():
    """The first exp is dead when the second is made: merging would keep it alive in between."""
    def fn(x):
        s = x.exp().sum()
        return s, x.exp() * 2.0

    x = torch.randn(4, 6)
    gm = _graph(fn, x)
    assert merge_repeated(gm) == 0 and count_op(gm, aten.exp.default) == 2


def test_other_arguments_random_ops_and_unset_memory_stay():
    def fn(x):
        noise = torch.rand_like(x) + torch.rand_like(x)
        unset = torch.empty_like(x), torch.empty_like(x)
        return noise, x * 2.0 + x * 3.0, unset

    x = torch.randn(4, 6)
    gm = _graph(fn, x)
    before = {t: count_op(gm, t) for t in (aten.rand_like.default, aten.empty_like.default, aten.mul.Tensor)}
    assert merge_repeated(gm) == 0
    assert {t: count_op(gm, t) for t in before} == before == {aten.rand_like.default: 2,
                                                              aten.empty_like.default: 2, aten.mul.Tensor: 2}


def test_a_graph_that_mutates_in_place_is_left_as_it_is():
    def fn(x):
        a = x * 2.0
        a.add_(1.0)
        return a, x * 2.0

    x = torch.randn(4, 6)
    gm = make_fx(fn)(x)
    before = count_op(gm, aten.mul.Tensor)
    assert merge_repeated(gm) == 0 and count_op(gm, aten.mul.Tensor) == before == 2
