"""Apply one family's chain patterns to an FX graph: find sites, judge them, rewrite them."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import fx

from sgdiff import _compat
from sgdiff.patterns.matcher import Filled, Match, ReplayViews
from sgdiff.kernels import registry
from sgdiff.patterns.base import ChainPattern
from sgdiff.tiers import Contract, Tier

log = logging.getLogger("sgdiff")
aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Skip:
    """A site that was found and left as eager code, and why."""

    family: str
    op: str
    reason: str
    node: str = ""
    where: str = ""  # the model code the site came from: module path, file and line

    def __iter__(self):  # unpacks as (family, op, reason)
        return iter((self.family, self.op, self.reason))


@dataclasses.dataclass
class PassResult:
    """What one family's pass did to one graph."""

    family: str
    matched_count: int = 0  # sites rewritten
    found_count: int = 0  # sites found, rewritten or not
    ops: Dict[str, int] = dataclasses.field(default_factory=dict)  # op -> sites rewritten
    skipped: List[Skip] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Site:
    pattern: ChainPattern
    match: Match
    contract: Contract


def apply_family(gm: fx.GraphModule, family: str, patterns: Sequence[ChainPattern], tier: Tier) -> PassResult:
    """Rewrite every admitted site of ``family`` in ``gm`` (in place) and report what happened."""
    result = PassResult(family)
    sites: List[_Site] = []
    claimed: set = set()
    inside: set = set()  # every node a chosen site covers, its shared views too
    guard_failed = False
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function" or node in claimed:
            continue
        # a root is one site, however many of the family's variants fit it (a larger variant's
        # skip is still reported where a smaller one takes the site)
        counted = False
        for pattern in patterns:
            match, reason = _first_fit(pattern, node, claimed)
            if match is None:
                continue
            contract = registry.op_def(pattern.op).contract
            if not tier.admits(contract):  # its guard matters only where the tier admits the op
                reason = OVERLAP if reason == OVERLAP else _not_admitted(contract, tier)
            elif reason is not None:
                guard_failed = True
            if reason is not None and node in inside and reason == OVERLAP:
                continue  # a view inside a site taken whole: not a site of its own
            if not counted:
                result.found_count += pattern.chains
                counted = True
            if reason is not None:
                result.skipped.append(Skip(family, pattern.op, reason, node.name, source_of(node)))
                log.debug("sgdiff: %s site at %s skipped: %s", family, node.name, reason)
                continue
            sites.append(_Site(pattern, match, contract))
            claimed.update(n for n in match.nodes if n not in match.shared)
            inside.update(match.nodes)
            break

    # Non-bit-exact rewrites are all-or-nothing per graph and family: one graph never mixes
    # numerics within a family.
    if guard_failed and any(s.contract is not Contract.BITEXACT for s in sites):
        keep = []
        for s in sites:
            if s.contract is Contract.BITEXACT:
                keep.append(s)
            else:
                result.skipped.append(Skip(family, s.pattern.op,
                                           "another site of this family failed its guard "
                                           f"({s.contract.value} rewrites are all-or-nothing)",
                                           s.match.root.name, source_of(s.match.root)))
        sites = keep

    for site in sites:
        _rewrite(gm.graph, site)
        result.matched_count += site.pattern.chains
        result.ops[site.pattern.op] = result.ops.get(site.pattern.op, 0) + site.pattern.chains
    if sites:
        settle(gm)
    return result


def rewrite_each(gm: fx.GraphModule, target, find: Callable[[fx.Node], Any],
                 rewrite: Callable[[fx.Node, Any], bool], what: str) -> int:
    """An exact pass over ``gm``: at each call of ``target`` where ``find(node)`` gives a match,
    ``rewrite(node, match)`` edits the graph (False: it left the node as it was); then the graph
    is settled and ``what`` logged with the count. Returns how many nodes were rewritten."""
    count = 0
    for node in list(gm.graph.nodes):
        found = find(node) if node.op == "call_function" and node.target is target else None
        if found is not None and rewrite(node, found):
            count += 1
    if count:
        settle(gm)
        log.debug("sgdiff: %d %s", count, what)
    return count


def settle(gm: fx.GraphModule) -> None:
    """After a pass's edits: drop the nodes nothing reads any more, check the graph, regenerate its code."""
    gm.graph.eliminate_dead_code(is_impure_node=_impure)
    gm.graph.lint()
    gm.recompile()


#: ATen's fused attention kernels, tagged nondeterministic (their dropout): without dropout, what
#: they compute is all they do, so one nothing reads any more is dropped like any other node
_ATTENTION_KERNELS = {torch.ops.aten._scaled_dot_product_flash_attention.default: 3,
                      torch.ops.aten._scaled_dot_product_efficient_attention.default: 5,
                      torch.ops.aten._scaled_dot_product_cudnn_attention.default: 5,
                      torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: 3}


def _impure(node: fx.Node) -> bool:
    position = _ATTENTION_KERNELS.get(node.target) if node.op == "call_function" else None
    if position is not None:
        dropout = node.kwargs.get("dropout_p", node.args[position] if len(node.args) > position else 0.0)
        return dropout != 0.0
    return node.is_impure()


OVERLAP = "overlaps a site already rewritten"


def _first_fit(pattern: ChainPattern, node: fx.Node, claimed: set) -> Tuple[Optional[Match], Optional[str]]:
    """The first match of ``pattern`` rooted at ``node`` that can be rewritten, else the first
    match with the reason it cannot; (None, None) if the chain does not fit at all."""
    first: Tuple[Optional[Match], Optional[str]] = (None, None)
    for m in pattern.chain.matches(node, Match(root=node)):
        if any(n in claimed for n in m.nodes if n not in m.shared):
            reason = OVERLAP
        elif m.escaping_users():
            inner, user = m.escaping_users()[0]
            reason = f"intermediate {inner.name} has another user ({user.name})"
        else:
            try:
                reason = pattern.check(m)
            except Exception as exc:  # a guard must never crash compilation
                reason = f"guard raised {type(exc).__name__}: {exc}"
        if reason is None:
            return m, None
        if first[0] is None:
            first = (m, reason)
    return first


def _not_admitted(contract: Contract, tier: Tier) -> str:
    """Why a rewrite whose guard passed is left eager at ``tier``, and what would admit it."""
    admitting = next((t for t in Tier if t.admits(contract)), None)
    hint = f"; quality={admitting.value!r} admits it" if admitting is not None else ""
    return (f"contract {contract.value} is not admitted at {tier.value} (its numerics are not eager's "
            f"bit for bit{hint})")


def source_of(node: fx.Node) -> str:
    """Where a node's code is in the model: the innermost module's path and the last frame of
    its stack trace (``blocks.0.norm1 (transformer_flux.py:123)``), as far as the graph knows."""
    stack = node.meta.get("nn_module_stack") or {}
    module = next(reversed(stack.values()))[0] if stack else ""
    module = re.sub(r"^L\['[^']*'\]\.?", "", module)  # the compiled frame's local: the model itself
    # torch's spellings of a submodule's path: `__dict__['_modules']['blocks']`, `_modules['blocks']`, `[1]`
    module = re.sub(r"(?:__dict__\['_modules'\]|_modules)\['([^']*)'\]", r".\1", module)
    module = re.sub(r"\[(\d+)\]", r".\1", module).replace("..", ".").strip(".")
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    line = f"{os.path.basename(frames[-1][0])}:{frames[-1][1]}" if frames else ""
    return " ".join(p for p in (module, f"({line})" if line and module else line) if p)


def _rewrite(graph: fx.Graph, site: _Site) -> None:
    root = site.match.root
    op = registry.op_def(site.pattern.op).load()
    with graph.inserting_before(root):
        args = tuple(_materialize(graph, a) for a in call_arguments(op, site.pattern, site.pattern.replacement(site.match)))
        new = graph.call_function(op, args)
    new.meta.update({k: v for k, v in root.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    _propagate_meta(new)
    root.replace_all_uses_with(new)


def call_arguments(op, pattern: ChainPattern, values: Dict[str, Any]) -> Tuple[Any, ...]:
    """The op's positional arguments from a pattern's arguments by name, checked against the
    op's schema: every name must be one of the op's, every argument without a default given;
    trailing arguments left at their defaults are dropped."""
    if not isinstance(values, dict):
        raise TypeError(f"pattern {pattern.name!r}: replacement must return the op's arguments by name, "
                        f"got {type(values).__name__}")
    schema = _compat.op_schema(op)
    names = [a.name for a in schema.arguments]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise TypeError(f"pattern {pattern.name!r}: {pattern.op} takes no argument {', '.join(unknown)}; "
                        f"its arguments: {', '.join(names)}")
    out, defaults = [], []
    for arg in schema.arguments:
        if arg.name in values:
            value = values[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise TypeError(f"pattern {pattern.name!r}: {pattern.op} needs its argument {arg.name!r}")
        out.append(value)
        defaults.append(arg.has_default_value() and _is_default(value, arg.default_value))
    while defaults and defaults[-1]:
        defaults.pop()
        out.pop()
    return tuple(out)


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (not isinstance(value, fx.Node) and type(value) is type(default) and value == default)


def _materialize(graph: fx.Graph, arg: Any) -> Any:
    if isinstance(arg, Filled):
        return _filled(graph, arg)
    if not isinstance(arg, ReplayViews):
        return arg
    t = arg.base
    for view in reversed(arg.views):  # innermost first
        t = graph.call_function(view.target, (t, *view.args[1:]), dict(view.kwargs))
        _propagate_meta(t)
    return t


def _filled(graph: fx.Graph, arg: Filled) -> fx.Node:
    """One ``aten.full`` node a graph for each :class:`Filled` value, after the graph's inputs
    (so that it precedes every use)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.meta.get("sgdiff_filled") == arg:
            return node
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    where = graph.inserting_after(inputs[-1]) if inputs else graph.inserting_before(next(iter(graph.nodes)))
    with where:
        node = graph.call_function(aten.full.default, (list(arg.shape), arg.value),
                                   dict(dtype=arg.dtype, device=arg.device, pin_memory=False))
    node.meta["sgdiff_filled"] = arg
    mode = _compat.fake_mode_of([n.meta["val"] for n in inputs if isinstance(n.meta.get("val"), torch.Tensor)])
    if mode is None:
        _propagate_meta(node)
    else:  # the graph's own fake mode, which the op's other operands' values share
        with mode:
            node.meta["val"] = torch.full(arg.shape, arg.value, dtype=arg.dtype, device=arg.device)
    return node


def _propagate_meta(node: fx.Node) -> None:
    """Fill ``node.meta['val']`` by running its target on the inputs' fake values."""
    value = fake_value(node)
    if value is not None:
        node.meta["val"] = value


def fake_value(node: fx.Node, value_of: Callable[[fx.Node], Any] = lambda n: n.meta.get("val")) -> Any:
    """``node``'s value computed by its target from its inputs' fake values (``value_of`` each
    input node), or None where they are symbolic without a fake mode; raises what the target
    raises on them."""
    vals = []
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: _collect(value_of(n), vals))
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    # make_fx in "real" mode gives every value a FakeTensorMode of its own: then make one
    fake_mode = _compat.fake_mode_of(tensors)
    if fake_mode is None:
        if any(_is_symbolic(t) for t in tensors):
            return None
        fake_mode = _compat.new_fake_mode()
        with fake_mode:
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _refake, (args, kwargs))
    with fake_mode:
        return node.target(*args, **kwargs)


def _collect(v: Any, vals: list):
    vals.append(v)
    return v


def _is_symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _refake(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
