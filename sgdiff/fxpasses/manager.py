"""The quality-aware pass manager.

One pass per chain family, applied in a fixed order; each pass rewrites only the sites whose
op contract the tier admits. The manager's identity (:meth:`PassManager.uuid`) covers the tier,
the families and the source of every pattern, so no compiled artifact is served under other
settings.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
from typing import Dict, Iterable, List, Optional, Sequence

from torch import fx

from sgdiff import patterns as pattern_registry
from sgdiff.fxpasses.addends import fold_addends
from sgdiff.fxpasses.copies import drop_copies
from sgdiff.fxpasses.fp8_rows import fold_norms_into_fp8_rows
from sgdiff.fxpasses.layouts import channels_last_into_convolutions
from sgdiff.fxpasses.matmul_fold import restore_matmul_folding
from sgdiff.fxpasses.narrow import narrow_elementwise
from sgdiff.fxpasses.rewrite import PassResult, Skip, apply_family
from sgdiff.fxpasses.repeated import merge_repeated
from sgdiff.fxpasses.siblings import merge_sibling_projections
from sgdiff.fxpasses.views import merge_same_views
from sgdiff.kernels import registry
from sgdiff.patterns.base import ChainPattern
from sgdiff.tiers import Tier

log = logging.getLogger("sgdiff")
graph_log = logging.getLogger("sgdiff.graphs")  # DEBUG: before/after graph dumps


@dataclasses.dataclass
class PatternPass:
    """All patterns of one family, applied together."""

    family: str
    patterns: Sequence[ChainPattern]

    def apply(self, gm: fx.GraphModule, quality: "Tier | str" = Tier.LOSSLESS) -> PassResult:
        _require_meta(gm)
        return apply_family(gm, self.family, sorted(self.patterns, key=lambda p: -p.priority),
                            Tier.parse(quality))

    def uuid(self) -> str:
        h = hashlib.sha256(self.family.encode())
        for p in self.patterns:
            h.update(repr((p.name, p.op, registry.op_def(p.op).contract.value, p.priority)).encode())
            for fn in (p.replacement, p.check):
                h.update(_source(fn).encode())
        return h.hexdigest()


@dataclasses.dataclass
class ManagerResult:
    """What every pass did to one graph."""

    tier: Tier
    passes: Dict[str, PassResult]
    dropped_copies: int = 0  # clones that changed nothing (:mod:`sgdiff.fxpasses.copies`)
    merged_projections: int = 0  # groups of projections of one input made one GEMM (:mod:`sgdiff.fxpasses.siblings`)
    folded_norms: int = 0  # LayerNorm-modulates that make their FP8 projections' rows (:mod:`sgdiff.fxpasses.fp8_rows`)

    @property
    def counts(self) -> Dict[str, int]:
        return {family: r.matched_count for family, r in self.passes.items()}

    @property
    def skipped(self) -> List[Skip]:
        return [s for r in self.passes.values() for s in r.skipped]


class PassManager:
    """Applies the registered patterns (or the given ones) at one quality tier.

    >>> result = PassManager("lossless").apply(gm)   # gm: a GraphModule with fake-tensor meta
    >>> result.counts["modulate"]
    """

    def __init__(self, quality: "Tier | str" = Tier.LOSSLESS, *,
                 families: Optional[Iterable[str]] = None,
                 patterns: Optional[Sequence[ChainPattern]] = None):
        self.tier = Tier.parse(quality)
        chosen = list(patterns) if patterns is not None else pattern_registry.all_patterns()
        if families is None and patterns is None:
            families = pattern_registry.default_families()
        wanted = None if families is None else set(families)
        by_family: Dict[str, List[ChainPattern]] = {}
        for p in chosen:
            if wanted is None or p.family in wanted:
                by_family.setdefault(p.family, []).append(p)
        order = [f for f in pattern_registry.families() if f in by_family]
        order += [f for f in by_family if f not in order]
        self.passes = [PatternPass(f, by_family[f]) for f in order]

    def apply(self, gm: fx.GraphModule) -> ManagerResult:
        _require_meta(gm)
        if graph_log.isEnabledFor(logging.DEBUG):
            graph_log.debug("sgdiff: graph before passes (%s):\n%s", self.tier.value, gm.code)
        merge_same_views(gm)  # exact at every tier: a view taken twice is one operand of a chain
        merge_repeated(gm)  # exact at every tier: a chain computed twice from one tensor is one chain
        narrow_elementwise(gm)  # exact at every tier: the families then see the 16-bit chain
        restore_matmul_folding(gm)  # exact: ATen's matmul decides at run time where the graph folded
        results = {}
        for p in self.passes:
            results[p.family] = p.apply(gm, self.tier)
            r = results[p.family]
            if r.found_count:
                log.info("sgdiff[%s]: %s rewrote %d of %d sites", self.tier.value, p.family,
                         r.matched_count, r.found_count)
        merged = merge_sibling_projections(gm)  # high: FP8 projections of one input as one GEMM, within their contract
        folded = fold_norms_into_fp8_rows(gm)  # high: a LayerNorm-modulate makes those GEMMs' e4m3 rows
        dropped = drop_copies(gm)  # exact at every tier
        fold_addends(gm)  # likewise
        channels_last_into_convolutions(gm)  # exact: first sight verifies each convolution
        if graph_log.isEnabledFor(logging.DEBUG):
            graph_log.debug("sgdiff: graph after passes (%s):\n%s", self.tier.value, gm.code)
        return ManagerResult(self.tier, results, dropped, merged, folded)

    def uuid(self) -> str:
        h = hashlib.sha256(self.tier.value.encode())
        for p in self.passes:
            h.update(p.uuid().encode())
        return h.hexdigest()


def _require_meta(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "placeholder" and "val" not in node.meta:
            raise ValueError(
                "sgdiff passes read fake-tensor metadata (node.meta['val']); trace the graph "
                "with make_fx or torch.compile, or run FakeTensorProp on it first"
            )


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return repr(code.co_code) if code is not None else repr(fn)
