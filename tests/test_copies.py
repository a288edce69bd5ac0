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


@pytest.mark.parametrize("name,fn,expected", [
    ("eval dropout after a linear", lambda x, w: F.dropout(F.linear(x, w), 0.1, training=False) * 2, 1),
    ("clone of an add", lambda x, w: (x + 1).clone() * 2, 1),
    ("clone of a reshape of a fresh output", lambda x, w: (x * 3).view(24, 8).clone() + 1, 1),
    ("the input read elsewhere too", lambda x, w: (lambda y: (y.clone() * 2, y))(x + 1), 0),
    ("a slice of a fresh output", lambda x, w: (x + 1)[:, :3].clone() * 2, 0),
    ("a transposed copy made contiguous", lambda x, w: (x + 1).transpose(1, 2).contiguous() * 2, 0),
    ("a graph input", lambda x, w: x.clone() * 2, 0),
])
def test_only_copies_that_change_nothing_go(name, fn, expected):
    assert dropped(fn, (x, w)) == expected, name


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
    assert f"dropped {drops} copies" in caplog.text
    assert bits_equal(got, want)
    assert sgdiff.explain(model, **kwargs).graphs == 1
