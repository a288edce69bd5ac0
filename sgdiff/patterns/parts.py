"""Sub-chains that several families share: norms, `1 + scale`, casts."""
from __future__ import annotations

import torch

from sgdiff.fxpasses.matcher import AnyOf, Arg, Expr, Lit, Op, Views, getitem

aten = torch.ops.aten


def layer_norm(x: str = "x", weight: str = "weight", bias: str = "bias", eps: str = "eps") -> Expr:
    """``F.layer_norm(x, shape, weight, bias, eps)`` in both of its ATen spellings.

    The norm output may feed several chains (one LayerNorm, two modulates), so it is shared.
    """
    args = dict(input=Arg(x), normalized_shape=Arg("normalized_shape"),
                weight=Arg(weight), bias=Arg(bias), eps=Arg(eps))
    return AnyOf(
        getitem(Op(aten.native_layer_norm.default, **args, shared=True), 0, shared=True, name="norm"),
        Op(aten.layer_norm.default, **args, shared=True, name="norm"),
    )


def plus_one(scale: str = "scale", views: str = "scale_views") -> Expr:
    """``1 + scale`` (traced as ``add(scale, 1)``), possibly indexed after the add:
    ``(1 + scale)[:, None, :]``. The add may have other users: it is cheap to redo."""
    return Views(AnyOf(Op(aten.add.Tensor, Arg(scale), Lit(1), alpha=Lit(1), shared=True),
                       Op(aten.add.Scalar, Arg(scale), Lit(1), alpha=Lit(1), shared=True)), views)
