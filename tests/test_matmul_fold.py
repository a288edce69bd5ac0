"""A matmul of a 3-D tensor by a matrix that the traced graph folds into one mm (torch 2.13) or
batches into a bmm (2.14) where eager may do the other (a slice whose size-1 dims' strides do not
nest: ConsisID's face extractor): the graph calls ATen's matmul itself, which decides at run time
as eager does (a weight that requires grad folds), and the output is eager's bits; what eager
always folds stays an mm, and a bmm the model wrote stays a bmm."""
import operator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.fxpasses.matmul_fold import restore_matmul_folding, strides_nest, strides_nest_past_ones
from tests.capture import capture
from tests.helpers import bits_equal, count_op

aten = torch.ops.aten


def sliced_matmul(lat, w):
    return lat[:, :1] @ w  # [B, 1, k]: a slice of the tokens


def _graph(fn, args):
    """``fn``'s graph (each a model's ``@``: its bmm tagged as dynamo records one) and the pass's count."""
    gm = capture(fn, args, False)
    for node in gm.graph.nodes:
        if node.target is aten.bmm.default:
            node.meta["source_fn_stack"] = [("matmul", operator.matmul)]
    return gm, restore_matmul_folding(gm)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(2, 5), k=st.sampled_from([2, 8, 33]), p=st.sampled_from([1, 16]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_a_folded_matmul_eager_may_batch_is_atens_matmul(B, T, k, p, dtype):
    g = torch.Generator().manual_seed(B * 100 + T)
    lat, w = torch.randn(B, T, k, generator=g).to(dtype), torch.randn(k, p, generator=g).to(dtype)
    gm, count = _graph(sliced_matmul, (lat, w))
    # the graph folded it (mm: torch 2.13's trace) or batched it (bmm: 2.14's); where the strides do
    # not nest, either way ATen's matmul decides at run time
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
    for _ in range(16):  # a 2-term sum: mm and bmm differ on some inputs only
        lat = torch.randn(2, 3, 2)
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


@pytest.mark.parametrize("source,rewritten", [(("matmul", operator.matmul), 1), (("linear", F.linear), 1),
                                              (("bmm", torch.bmm), 0), (None, 0)])
def test_a_matmul_the_graph_batched_goes_to_atens_matmul_only_if_the_model_called_matmul(source, rewritten):
    """A slice whose strides nest only once its size-1 dim is skipped, batched in the graph (as
    torch 2.14 traces ConsisID's ``latents[:, :1] @ w``; spelled out here, as 2.13 traces it folded):
    the bmm goes to ATen's matmul where dynamo recorded a matmul or a linear as its source, never
    where the model wrote the bmm (or nothing is recorded)."""
    lat, w = torch.randn(2, 3, 33), torch.randn(33, 16)

    def batched(lat, w):
        return torch.bmm(lat[:, :1].expand(2, 1, 33).reshape(2, 1, 33),
                         w.expand(2, 33, 16).reshape(2, 33, 16)).view(2, 1, 16)

    assert not strides_nest(lat[:, :1]) and strides_nest_past_ones(lat[:, :1])
    gm = capture(batched, (lat, w), False)
    (bmm,) = [n for n in gm.graph.nodes if n.target is aten.bmm.default]
    if source is not None:
        bmm.meta["source_fn_stack"] = [source]
    assert restore_matmul_folding(gm) == rewritten
    assert count_op(gm, aten.matmul.default) == rewritten and count_op(gm, aten.bmm.default) == 1 - rewritten
    assert bits_equal(gm(lat, w)[0], sliced_matmul(lat, w) if rewritten else batched(lat, w))


@pytest.mark.parametrize("fn,x", [(lambda x, w: x.transpose(0, 1) @ w, torch.randn(3, 5, 8)),
                                  (lambda x, w: F.linear(x.transpose(1, 2), w.t()), torch.randn(3, 8, 5))])
def test_strides_that_nest_neither_way_stay_a_bmm(fn, x):
    """x's batch dims transposed (no dim of size 1): eager batches the matmul as the graph does
    (Sana's to_out, a linear of a transposed input, keeps its bmm and the bias fold after it)."""
    w = torch.randn(8, 16)
    gm = capture(fn, (x, w), False)
    for n in gm.graph.nodes:
        if n.target is aten.bmm.default:
            n.meta["source_fn_stack"] = [("matmul", operator.matmul)]
    assert restore_matmul_folding(gm) == 0 and count_op(gm, aten.bmm.default) == 1
    assert bits_equal(gm(x, w)[0], fn(x, w))
