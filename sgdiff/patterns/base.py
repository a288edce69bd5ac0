"""What a chain pattern declares: where it applies, which op replaces it, and when it may."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import fx

from sgdiff.patterns.matcher import Expr, Match
from sgdiff.kernels.layout import like_strides, same_strides


@dataclasses.dataclass(frozen=True)
class Family:
    """A family of patterns, as its module declares it (``FAMILY = Family(...)``): the name a
    Report counts its sites under, and the families whose rewrites must run before its own
    (their chains hide inside its chains, or its patterns match their ops). A family that is
    not ``default`` is rewritten only where the options ask for it."""

    name: str
    after: Tuple[str, ...] = ()
    default: bool = True


@dataclasses.dataclass(frozen=True)
class ChainPattern:
    """An eager chain and the sgdiff op that replaces it.

    ``replacement(match)`` returns the op's arguments by name (graph nodes, literals,
    :class:`~sgdiff.patterns.matcher.ReplayViews` or :class:`~sgdiff.patterns.matcher.Filled`),
    checked against the op's schema when the site is rewritten; arguments left at their
    defaults are left out of the call, so a graph reads as the chain would without the option.
    ``check(match)`` is the static safety guard: it reads fake-tensor metadata only (never a
    device value) and returns a reason to skip the site, or None.
    """

    family: str
    name: str
    chain: Expr
    op: str
    replacement: Callable[[Match], Dict[str, Any]]
    check: Callable[[Match], Optional[str]] = lambda m: None
    #: larger chains first: a pattern that covers another's root wins the site
    priority: int = 0
    #: the family's chains one match rewrites, as sites are counted (two QK norms joined along the
    #: sequence before one RoPE: 2, as they count where each is rewritten alone)
    chains: int = 1

    def __post_init__(self):
        if not self.family or not self.name or not self.op:
            raise ValueError("a ChainPattern needs a family, a name and an op")


# --- helpers for checks: everything comes from node.meta["val"] ------------------------

def val(x: Any) -> Any:
    """Fake value of a node (a FakeTensor, SymInt, ...), or the literal itself."""
    return x.meta.get("val") if isinstance(x, fx.Node) else x


def tensor_meta(x: Any) -> Optional[torch.Tensor]:
    v = val(x)
    return v if isinstance(v, torch.Tensor) else None


def same_size(a, b) -> bool:
    """a == b for ints or SymInts, without adding a guard."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    try:
        return bool(statically_known_true(a == b))
    except Exception:
        return False


def same_shape(a, b) -> bool:
    """Equal shapes (ints or SymInts), without adding a guard."""
    return len(a) == len(b) and all(same_size(p, q) for p, q in zip(a, b))


def broadcast_reason(param: Any, target: torch.Tensor, what: str) -> Optional[str]:
    """Why ``param`` cannot act as an elementwise operand of ``target``'s shape, or None."""
    p = tensor_meta(param)
    if p is None:
        return f"{what} is not a tensor"
    if p.dim() > target.dim():
        return f"{what} has more dims than the input"
    for ps, ts in zip(reversed(p.shape), reversed(target.shape)):
        if not (same_size(ps, 1) or same_size(ps, ts)):
            return f"{what} of shape {tuple(p.shape)} does not broadcast to {tuple(target.shape)}"
    return None


def node_meta(x: Any) -> Dict[str, Any]:
    return x.meta if isinstance(x, fx.Node) else {}


def like_layout_reason(out: torch.Tensor, x: torch.Tensor) -> Optional[str]:
    """Why the chain's output ``out`` lacks the layout ``like(x)`` that row-wise and elementwise
    ops promise (:mod:`sgdiff.kernels.layout`), or None."""
    if not same_shape(out.shape, x.shape):
        return f"the chain's output shape {tuple(out.shape)} is not the input's {tuple(x.shape)}"
    if x.is_contiguous() and out.is_contiguous():
        return None
    if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(), *out.stride())):
        return "a non-contiguous layout with symbolic sizes"
    if not same_strides(out.shape, out.stride(), like_strides(x)):
        return f"the chain's output strides {tuple(out.stride())} do not follow the input's layout"
    return None
