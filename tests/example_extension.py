"""A user-defined pattern and op, registered through sgdiff's extension point.

``a * b + c`` on half-precision tensors, computed in one fp32 pass with one final rounding: a
``close`` rewrite (different rounding from eager's two roundings), so only extra-high and high
admit it. The guard refuses operands that are not all of one shape.
"""
import torch

from sgdiff.patterns.matcher import Arg, Lit, Op
from sgdiff.kernels import registry
from sgdiff.patterns import ChainPattern, register
from sgdiff.patterns.base import tensor_meta
from sgdiff.tiers import Contract

aten = torch.ops.aten


@torch.library.custom_op("sgdiff_example::mul_add", mutates_args=())
def mul_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.float() * b.float() + c.float()).to(a.dtype)


@mul_add.register_fake
def _(a, b, c):
    return torch.empty_like(a)


def _check(m):
    shapes = {tuple(tensor_meta(m[k]).shape) for k in "abc"}
    return None if len(shapes) == 1 else "operands of different shapes"


OP = registry.register_op(registry.OpDef("sgdiff_example::mul_add", Contract.CLOSE, module=__name__))
PATTERN = ChainPattern(
    family="example",
    name="example_mul_add",
    chain=Op(aten.add.Tensor, Op(aten.mul.Tensor, Arg("a"), Arg("b")), Arg("c"), alpha=Lit(1)),
    op="sgdiff_example::mul_add",
    replacement=lambda m: dict(a=m["a"], b=m["b"], c=m["c"]),
    check=_check,
)


def install():
    register(PATTERN, replace=True)


def uninstall():
    from sgdiff.patterns import unregister

    unregister(PATTERN.name)
