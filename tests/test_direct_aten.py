"""direct_aten_calls: the same ATen kernels through their bindings, the same tensors out."""
import pytest
import torch
from torch import fx

from sgdiff.fxpasses.direct_aten import DIRECT, direct_aten_calls

aten = torch.ops.aten


def graph_of(*calls):
    """A GraphModule over placeholders a, b, c (tensors) returning each call's result:
    ``calls`` are (overload, args, kwargs) with "a"/"b"/"c" standing for the inputs."""
    g = fx.Graph()
    inputs = {name: g.placeholder(name) for name in "abc"}

    def sub(v):
        if isinstance(v, str) and v in inputs:
            return inputs[v]
        if isinstance(v, (list, tuple)):
            return type(v)(sub(x) for x in v)
        return v

    outs = [g.call_function(op, tuple(sub(a) for a in args), kwargs) for op, args, kwargs in calls]
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


CALLS = [
    (aten.view.default, ("a", [6, 4]), {}),
    (aten.t.default, ("c",), {}),
    (aten.unsqueeze.default, ("a", 1), {}),
    (aten.transpose.int, ("a", 0, 2), {}),
    (aten.expand.default, ("b", [2, 3, 4]), {}),
    (aten.permute.default, ("a", [2, 0, 1]), {}),
    (aten.split.Tensor, ("a", 2), {}),
    (aten.split.Tensor, ("a", 3, 2), {}),
    (aten.addmm.default, ("b", "c", "c"), {}),
    (aten.mm.default, ("c", "c"), {}),
    (aten.cat.default, (["a", "a"],), {}),
    (aten.cat.default, (["a", "a"], 2), {}),
    (aten.mul.Tensor, ("a", "b"), {}),
    (aten.add.Tensor, ("a", "b"), {}),
    (aten.silu.default, ("a",), {}),
    (aten.gelu.default, ("a",), {"approximate": "tanh"}),
    (aten.clone.default, ("a",), {"memory_format": torch.contiguous_format}),
]


def inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 4, generator=g).to(dtype)
    return a, torch.randn(4, generator=g).to(dtype), torch.randn(4, 4, generator=g).to(dtype)


def same(x, y):
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same(p, q) for p, q in zip(x, y))
    return (torch.equal(x, y) and x.dtype == y.dtype and x.stride() == y.stride()
            and x.storage_offset() == y.storage_offset())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_listed_call_is_retargeted_and_gives_the_same_tensors(dtype):
    calls = CALLS
    gm = graph_of(*calls)
    a, b, c = inputs(dtype)
    want = gm(a, b, c)
    assert direct_aten_calls(gm) == len(calls)
    assert not [n for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)]
    got = gm(a, b, c)
    assert all(same(x, y) for x, y in zip(got, want))
    views = [i for i, (op, _, _) in enumerate(calls) if op in (aten.view.default, aten.t.default,
                                                               aten.unsqueeze.default, aten.transpose.int,
                                                               aten.expand.default, aten.permute.default)]
    named = {"a": a, "b": b, "c": c}
    for i in views:  # views stay views of their input
        assert got[i].untyped_storage().data_ptr() == named[calls[i][1][0]].untyped_storage().data_ptr()


def test_bmm():  # operands of their own: the shared inputs above do not multiply
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output(g.call_function(aten.bmm.default, (x, y)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    want = gm(x, y)
    assert direct_aten_calls(gm) == 1 and torch.equal(gm(x, y), want)


def test_every_entry_is_tested():
    assert set(DIRECT) == {op for op, _, _ in CALLS} | {aten.bmm.default}


@pytest.mark.parametrize("call", [
    (aten.add.Tensor, ("a", 1.5), {}),  # a scalar operand: its promotion is the overload's to make
    (aten.mul.Tensor, ("a", 2), {}),
    (aten.add.Tensor, ("a", "b"), {"alpha": 2}),  # a keyword the entry does not list
    (aten.expand.default, ("b", [2, 3, 4]), {"implicit": True}),
    (aten.view.default, ("a", 24), {}),  # not a list of sizes
    (aten.unsqueeze.default, ("a", True), {}),  # a flag is not a dim
    (aten.split.Tensor, ("a", [1, 1], 0), {}),
    (aten.sin.default, ("a",), {}),  # not listed
], ids=lambda c: str(c[0]))
def test_calls_outside_the_table_keep_their_overload(call):
    gm = graph_of(call)
    assert direct_aten_calls(gm) == 0
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [call[0]]
