"""A small matcher for eager chains in ATen-level FX graphs.

A chain is written as a tree of expressions that reads like the model code::

    norm = Op(aten.native_layer_norm.default, Arg("x"), Arg("shape"), ...)
    chain = Op(aten.add.Tensor, Op(aten.mul.Tensor, norm, Arg("scale"), commutative=True),
               Arg("shift"), alpha=Lit(1), commutative=True)

Matching a node yields every consistent way the tree fits (commutative operands and
alternatives are tried in turn), each as a :class:`Match` holding the bound arguments and the
graph nodes the chain covers. Arguments are compared by their schema names, defaults
included, so ``add(a, b)`` and ``add(a, b, alpha=1)`` read the same.

Nothing here edits a graph; :mod:`sgdiff.fxpasses.rewrite` does.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import fx

from sgdiff import _compat

aten = torch.ops.aten


#: ops that read a tensor's sizes, not its values
SIZE_READS = (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default)


@dataclasses.dataclass(frozen=True)
class Match:
    """One way a chain fits the graph."""

    root: Optional[fx.Node] = None
    bindings: Tuple[Tuple[str, Any], ...] = ()
    nodes: Tuple[fx.Node, ...] = ()  # every op node the chain covers, root included
    shared: Tuple[fx.Node, ...] = ()  # covered nodes allowed to keep users outside the chain

    def __getitem__(self, name: str) -> Any:
        for key, value in self.bindings:
            if key == name:
                return value
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: str) -> bool:
        return any(key == name for key, _ in self.bindings)

    def bind(self, name: str, value: Any) -> Optional["Match"]:
        if name in self:
            return self if _same(self[name], value) else None
        return dataclasses.replace(self, bindings=self.bindings + ((name, value),))

    def cover(self, node: fx.Node, shared: bool) -> "Match":
        return dataclasses.replace(
            self,
            nodes=self.nodes + (node,),
            shared=self.shared + ((node,) if shared else ()),
        )

    def escaping_users(self) -> List[Tuple[fx.Node, fx.Node]]:
        """(covered node, outside user) pairs for covered nodes that must stay private.

        A user that reads only the node's sizes (``sym_size`` in graphs with dynamic shapes)
        does not count: it keeps the node alive, but sees the same sizes after a rewrite."""
        inside = set(self.nodes)
        return [
            (node, user)
            for node in self.nodes
            if node is not self.root and node not in self.shared
            for user in node.users
            if user not in inside and user.target not in SIZE_READS
        ]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    return type(a) is type(b) and a == b


class Expr:
    """Base of the chain vocabulary."""

    def matches(self, value: Any, m: Match) -> Iterator[Match]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Arg(Expr):
    """Any value (node or literal), bound to ``name``; the same name must bind the same value."""

    name: str
    check: Optional[Callable[[Any], bool]] = None

    def matches(self, value, m):
        if self.check is not None and not self.check(value):
            return
        bound = m.bind(self.name, value)
        if bound is not None:
            yield bound


@dataclasses.dataclass(frozen=True)
class Lit(Expr):
    """A literal argument equal to ``value`` (``1`` also matches ``1.0``, never ``True``)."""

    value: Any

    def matches(self, value, m):
        if isinstance(value, fx.Node) or isinstance(value, bool) != isinstance(self.value, bool):
            return
        if value == self.value:
            yield m


@dataclasses.dataclass(frozen=True)
class AnyOf(Expr):
    """The first alternative that fits, then the next, ..."""

    alternatives: Tuple[Expr, ...]

    def __init__(self, *alternatives: Expr):
        object.__setattr__(self, "alternatives", tuple(alternatives))

    def matches(self, value, m):
        for alt in self.alternatives:
            yield from alt.matches(value, m)


@dataclasses.dataclass(frozen=True)
class Items(Expr):
    """A list argument (the tensors of ``cat`` or ``stack``) whose items match in order."""

    items: Tuple[Expr, ...]

    def __init__(self, *items: Expr):
        object.__setattr__(self, "items", tuple(items))

    def matches(self, value, m):
        if isinstance(value, (list, tuple)) and len(value) == len(self.items):
            yield from _match_all(list(zip(self.items, value)), m)


@dataclasses.dataclass(frozen=True)
class When(Expr):
    """``inner`` at a value for which ``predicate(value)`` holds; elsewhere no match at all.

    A structural filter (e.g. "the norm output is split into heads"): unlike a pattern's check,
    a value it rejects is not a site, so it is neither rewritten nor reported as skipped.
    """

    inner: Expr
    predicate: Callable[[Any], bool]

    def matches(self, value, m):
        if self.predicate(value):
            yield from self.inner.matches(value, m)


class Op(Expr):
    """A call of one of ``targets`` whose arguments match the given sub-expressions.

    Positional sub-expressions line up with the op schema's arguments; keyword ones name them.
    Arguments not mentioned are not checked. ``commutative`` also tries the first two operands
    swapped. ``name`` binds the node itself. ``shared`` lets the node keep users outside the
    chain (a norm output feeding two modulates); other covered nodes must not have any.
    """

    def __init__(self, targets, *args: Expr, commutative: bool = False, name: Optional[str] = None,
                 shared: bool = False, **kwargs: Expr):
        self.targets = tuple(targets) if isinstance(targets, (tuple, list)) else (targets,)
        self.args = args
        self.kwargs = kwargs
        self.commutative = commutative
        self.name = name
        self.shared = shared

    def __repr__(self):
        return f"Op({', '.join(map(str, self.targets))})"

    def matches(self, value, m):
        if not (isinstance(value, fx.Node) and value.op == "call_function"):
            return
        if value.target not in self.targets:
            return
        actual = bound_arguments(value)
        if actual is None:
            return
        names = list(actual)
        if len(self.args) > len(names):
            return
        pairs = [(names[i], e) for i, e in enumerate(self.args)] + list(self.kwargs.items())
        if any(name not in actual for name, _ in pairs):
            return
        orders = [pairs]
        if self.commutative and len(self.args) >= 2:
            swapped = [(pairs[1][0], pairs[0][1]), (pairs[0][0], pairs[1][1])] + pairs[2:]
            orders.append(swapped)
        start = m.cover(value, self.shared)
        if self.name is not None:
            start = start.bind(self.name, value)
            if start is None:
                return
        for order in orders:
            yield from _match_all([(e, actual[n]) for n, e in order], start)


def _match_all(items: Sequence[Tuple[Expr, Any]], m: Match) -> Iterator[Match]:
    if not items:
        yield m
        return
    (expr, value), rest = items[0], items[1:]
    for m1 in expr.matches(value, m):
        yield from _match_all(rest, m1)


def bound_arguments(node: fx.Node) -> Optional[Dict[str, Any]]:
    """The node's arguments by schema name, defaults filled in (positional for non-ATen)."""
    target = node.target
    schema = _compat.op_schema(target)
    if schema is None:
        return {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    out: Dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        elif arg.kwarg_only:
            out[arg.name] = None
        else:
            return None
    return out


# --- views that only move or broadcast elements (so elementwise ops commute with them) ----

BROADCAST_VIEWS = (
    aten.unsqueeze.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.slice.Tensor,
    aten.alias.default,
)


@dataclasses.dataclass(frozen=True)
class Views(Expr):
    """Zero or more view ops (``unsqueeze``, ``[:, None]``, ``view``, ...) above ``inner``.

    The view nodes are bound, outermost first, under ``name`` so a replacement can replay them
    on another tensor of the same shape (:class:`ReplayViews`).
    """

    inner: Expr
    name: str

    def matches(self, value, m, _chain: Tuple[fx.Node, ...] = ()):
        for m1 in self.inner.matches(value, m):
            bound = m1.bind(self.name, _chain)
            if bound is not None:
                yield bound
        if isinstance(value, fx.Node) and value.op == "call_function" and value.target in BROADCAST_VIEWS:
            yield from self.matches(value.args[0], m.cover(value, shared=True), _chain + (value,))


@dataclasses.dataclass(frozen=True)
class ReplayViews:
    """Replacement argument: ``views`` (outermost first) applied again to ``base``."""

    views: Tuple[fx.Node, ...]
    base: Any


@dataclasses.dataclass(frozen=True)
class Filled:
    """Replacement argument: a tensor of ``shape`` holding ``value`` everywhere, which the chain
    computes with but does not hold (a gate of ones standing for an ungated sum)."""

    shape: Tuple[int, ...]
    value: float
    dtype: torch.dtype
    device: torch.device


def getitem(expr: Expr, index: int, **kw) -> Op:
    return Op(operator.getitem, expr, Lit(index), **kw)


def find(graph: fx.Graph, chain: Expr) -> Iterator[Match]:
    """Every node of ``graph`` at which ``chain`` fits, with its first fitting match."""
    for node in list(graph.nodes):
        for m in chain.matches(node, Match(root=node)):
            yield m
            break
