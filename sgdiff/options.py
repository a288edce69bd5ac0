"""Backend options: one typed object, unknown keys rejected with the valid ones named."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from sgdiff.tiers import DEFAULT_TIER, Tier

#: torch.compile's mode names, as sgdiff reads them. sgdiff runs its graphs under CUDA graphs by
#: default (no mode, "default", "reduce-overhead", "max-autotune"); "max-autotune-no-cudagraphs"
#: turns them off, as ``options={"cudagraphs": False}`` does (an explicit option wins). (sgdiff's
#: own GEMMs, ``gemm=True``, are tuned at first sight of each signature whatever the mode.)
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
NO_CUDAGRAPH_MODES = ("max-autotune-no-cudagraphs",)


@dataclasses.dataclass(frozen=True)
class Options:
    #: quality tier: "lossless" (default; output torch.equal to eager), "extra-high", "high"
    quality: Tier = DEFAULT_TIER
    #: run the rewritten graph under CUDA graphs, one per input shape (see
    #: :mod:`sgdiff.fxpasses.cudagraphs`: warm-up calls, then capture and replay; memory: each
    #: graph's working memory held between calls, plus its inputs and outputs); on by default
    cudagraphs: bool = True
    #: rewrite only these chain families (None: every family on by default, all but "gemm");
    #: e.g. ("modulate",)
    families: Optional[Tuple[str, ...]] = None
    #: also rewrite the "gemm" family: linear layers as sgdiff's own GEMM (cuBLAS's bits) with
    #: the chain after them (activation, gated residual) as its epilogue, each site on whichever
    #: of cuBLAS + the chain's kernel and the fused GEMM first sight times faster. Off by default
    #: for now: with the CuTe DSL GEMM (Hopper, ``sgdiff[gemm]``) Flux.1-dev's and Wan's steps
    #: measure faster with it (bench/results/rivals.md), Sana's is not yet measured with it, and
    #: with the Triton GEMM alone Flux.1-dev's measured slower (bench/results/README.md)
    gemm: bool = False
    #: check each accelerated kernel bitwise against its reference the first time it meets
    #: a new input signature (lossless kernels only)
    verify: bool = True

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]] = None, mode: Optional[str] = None) -> "Options":
        """From ``torch.compile(..., options=..., mode=...)``; raises ValueError on anything unknown."""
        if mode not in MODES:
            raise ValueError(f"unknown sgdiff mode {mode!r}; valid: {', '.join(map(repr, MODES))}")
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"unknown sgdiff option(s) {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
        if "quality" in options:
            options["quality"] = Tier.parse(options["quality"])
        if options.get("families") is not None:
            options["families"] = _families(options["families"])
        for flag in ("cudagraphs", "verify", "gemm"):
            if flag in options and not isinstance(options[flag], bool):
                raise ValueError(f"sgdiff option {flag!r} must be True or False, got {options[flag]!r}")
        if mode in NO_CUDAGRAPH_MODES:
            options.setdefault("cudagraphs", False)
        return cls(**options)

    def chosen_families(self) -> Tuple[str, ...]:
        """The families the passes rewrite: ``families``, or the default ones; with ``gemm``,
        "gemm" too."""
        from sgdiff import patterns

        names = self.families if self.families is not None else tuple(patterns.default_families())
        return names + (("gemm",) if self.gemm and "gemm" not in names else ())


def _families(value) -> Tuple[str, ...]:
    from sgdiff import patterns

    names = (value,) if isinstance(value, str) else tuple(value)
    known = patterns.families()
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown chain famil{'y' if len(bad) == 1 else 'ies'} {bad}; valid: {', '.join(known)}")
    return names
