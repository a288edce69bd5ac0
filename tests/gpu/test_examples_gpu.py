"""Every example every op declares, at its real size on the GPU.

For each: the implementation accepts its own example; the op gives the reference's bits (the
implementation verified at first sight, nothing disabled), the implementation called directly
does too, and so does the model's own spelling of the chain (the example's ``chain``). Ops of a
``close`` contract are checked by their own tests; here their implementation must only run.
"""
import pytest
import torch

from sgdiff.kernels import dispatch, registry
from sgdiff.tiers import Contract

pytestmark = pytest.mark.gpu


def _cases():
    return [pytest.param(op.name, i, id=f"{op.name}: {e.label} #{i}")
            for op in registry.ops() for i, e in enumerate(op.examples)]


def _same_bits(got, want):
    diff = dispatch._first_difference(got, want)
    assert diff is None, diff


@pytest.mark.parametrize("op,index", _cases())
def test_example_at_real_size(op, index, fresh_dispatch):
    op_def = registry.op_def(op)
    example = op_def.examples[index]
    args = example.args("cuda")
    want = dispatch.reference(op)(*args)
    impls = [s.load() for s in registry.kernel_specs(op) if s.backend != "reference"]
    assert impls, f"{op} has no implementation besides its reference"
    for impl in impls:
        assert impl.supports is None or impl.supports(*args), f"{op}'s implementation refuses its own example"
        got = impl.run(*args)
        if op_def.contract is Contract.BITEXACT:
            _same_bits(got, want)
    if op_def.contract is Contract.BITEXACT:
        _same_bits(op_def.load()(*args), want)
        assert not dispatch.disabled(), dispatch.disabled()
        if example.chain is not None:
            _same_bits(example.chain(*args)(), want)
    torch.cuda.synchronize()
