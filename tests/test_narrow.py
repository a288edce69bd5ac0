"""narrow_elementwise: ``(a.float() op b.float()).to(a.dtype)`` of 16-bit a and b is ATen's 16-bit
op (computed in fp32, rounded once), so it is written as that op and the families see the chain
they know; near misses keep their spelling. Outputs are eager's bit for bit."""
import pytest
import torch

from sgdiff.fxpasses.narrow import narrow_elementwise
from tests.capture import capture, rewrite
from tests.helpers import count_op

aten = torch.ops.aten


def casts(gm):
    return count_op(gm, aten._to_copy.default)


def narrowed(fn, args):
    gm = capture(fn, args)
    count = narrow_elementwise(gm)
    out = gm(*args)
    assert torch.equal(out[0] if len(out) == 1 else out, fn(*args))
    return count, gm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["mul", "add", "sub"])
def test_a_16_bit_op_through_fp32_is_the_16_bit_op(dtype, op):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 5, 8, generator=g).to(dtype) * 100 for _ in range(2))
    f = {"mul": torch.mul, "add": torch.add, "sub": torch.sub}[op]
    count, gm = narrowed(lambda a, b: f(a.float(), b[:1].float()).to(dtype), (a, b))
    assert count == 1 and casts(gm) == 0
    # the 16-bit op itself: the same bits on every element, over the whole range
    x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x)]  # (NaN is never equal to itself)
    y = x.flip(0)
    assert torch.equal(f(x.float(), y.float()).to(dtype), f(x, y))


@pytest.mark.parametrize("name,fn", [
    ("rounded to another dtype", lambda a, b: (a.float() * b.float()).to(torch.float16)),
    ("one operand fp32 already", lambda a, b: (a.float() * b.float().exp()).to(torch.bfloat16)),
    ("kept in fp32", lambda a, b: a.float() * b.float()),
    ("alpha 2", lambda a, b: torch.add(a.float(), b.float(), alpha=2).to(torch.bfloat16)),
    ("a division (not taken)", lambda a, b: (a.float() / b.float()).to(torch.bfloat16)),
])
def test_near_misses_keep_their_spelling(name, fn):
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(4, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    count, _ = narrowed(fn, (a, b))
    assert count == 0, name


def test_ernies_gated_residual_is_a_site():
    """ERNIE-Image's ``residual + (gate.float() * y.float()).to(x.dtype)`` in bf16: one gated
    residual, eager's bits."""
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randn(2, 6, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    gate = torch.randn(2, 1, 16, generator=g).to(torch.bfloat16)

    def fn(x, gate, y):
        return x + (gate.float() * y.float()).to(x.dtype)

    run, gm, result = rewrite(fn, (x, gate, y))
    assert result.counts["residual_gate"] == 1
    assert torch.equal(run(x, gate, y), fn(x, gate, y))
