"""drop_copies: a clone of a fresh tensor that nothing else reads (eval-mode dropout) goes; every
other clone stays, and outputs keep their bits and strides."""
import logging

import pytest
import torch
import torch.nn.functional as F

import sgdiff
from sgdiff import zoo
from sgdiff.fxpasses import PassManager
from tests.capture import capture
from tests.helpers import bits_equal

aten = torch.ops.aten


def clones(gm):
    return sum(n.target is aten.clone.default for n in gm.graph.nodes)


def dropped(fn, args):
    gm = capture(fn, args)
    before = clones(gm)
    result = PassManager("lossless", families=[]).apply(gm)
    assert clones(gm) == before - result.dropped_copies
    out, want = gm(*args), fn(*args)
    got = out[0] if len(out) == 1 else tuple(out)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert bits_equal(g, w) and g.stride() == w.stride()
    return result.dropped_copies


x = torch.randn(4, 6, 8)
w = torch.randn(8, 8)


def _eval_dropout(x, w):
    return F.dropout(F.linear(x, w), 0.1, training=False) * 2


def eval_dropout_copies() -> int:
    """The copies this torch's trace makes of an eval-mode dropout (torch 2.13: a clone; 2.14: none)."""
    return clones(capture(_eval_dropout, (x, w)))


@pytest.mark.parametrize("name,fn,expected", [
    ("eval dropout after a linear", _eval_dropout, "traced"),
    ("clone of an add", lambda x, w: (x + 1).clone() * 2, 1),
    ("clone of a reshape of a fresh output", lambda x, w: (x * 3).view(24, 8).clone() + 1, 1),
    ("the input read elsewhere too", lambda x, w: (lambda y: (y.clone() * 2, y))(x + 1), 0),
    ("a slice of a fresh output", lambda x, w: (x + 1)[:, :3].clone() * 2, 0),
    ("a transposed copy made contiguous", lambda x, w: (x + 1).transpose(1, 2).contiguous() * 2, 0),
    ("a graph input", lambda x, w: x.clone() * 2, 0),
])
def test_only_copies_that_change_nothing_go(name, fn, expected):
    assert dropped(fn, (x, w)) == (eval_dropout_copies() if expected == "traced" else expected), name


# Flux: the FF dropouts of its double block. (Sana's and PixArt's dropout copies precede a
# residual update's `/ rescale_output_factor` or gate, whose op absorbs them.)
@pytest.mark.parametrize("name,drops", [("flux", 2)])
def test_real_models_lose_their_dropout_copies_and_keep_their_bits(name, drops, caplog):
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    model, kwargs = zoo.build(name, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(**kwargs)[0]
        torch._dynamo.reset()
        with caplog.at_level(logging.INFO, logger="sgdiff"):
            got = torch.compile(model, backend="sgdiff")(**kwargs)[0]
        torch._dynamo.reset()
    if eval_dropout_copies():  # this torch traces an eval-mode dropout as a copy
        assert f"dropped {drops} copies" in caplog.text
    else:
        assert "copies" not in caplog.text
    assert bits_equal(got, want)
    assert sgdiff.explain(model, **kwargs).graphs == 1


def _contiguous_clone_graph(output_clone: bool):
    """``y = x * 2; c = clone(y, memory_format=contiguous); out = c + 1`` (and ``c`` too)."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(aten.mul.Tensor, (x, 2))
    c = graph.call_function(aten.clone.default, (y,), {"memory_format": torch.contiguous_format})
    out = graph.call_function(aten.add.Tensor, (c, 1))
    graph.output((out, c) if output_clone else (out,))
    return torch.fx.GraphModule({}, graph)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_traced_contiguous_copies_only_what_is_not_contiguous(layout):
    from sgdiff.fxpasses.copies import lazy_contiguous

    gm = _contiguous_clone_graph(output_clone=False)
    x = torch.randn(4, 6) if layout == "contiguous" else torch.randn(6, 4).t()
    want = gm(x)
    assert lazy_contiguous(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["contiguous"]
    assert bits_equal(gm(x)[0], want[0]) and gm(x)[0].is_contiguous()


def test_a_contiguous_copy_that_is_an_output_or_of_an_input_stays_a_copy():
    from sgdiff.fxpasses.copies import lazy_contiguous

    assert lazy_contiguous(_contiguous_clone_graph(output_clone=True)) == 0
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c = graph.call_function(torch.ops.aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (c, 1)),))
    assert lazy_contiguous(torch.fx.GraphModule({}, graph)) == 0
