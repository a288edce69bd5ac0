"""Backend options: one typed object, unknown keys rejected with the valid ones named."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from sgdiff.tiers import DEFAULT_TIER, Tier

#: torch.compile's mode names, as sgdiff reads them. sgdiff runs its graphs under CUDA graphs by
#: default (no mode, "default", "reduce-overhead", "max-autotune"); "max-autotune-no-cudagraphs"
#: turns them off, as ``options={"cudagraphs": False}`` does (an explicit option wins). (sgdiff's
#: own GEMMs, the gemm family, are tuned at first sight of each signature whatever the mode.)
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
    #: the "gemm" family: linear layers as sgdiff's own GEMM (cuBLAS's bits) with the chain after
    #: them (activation, gated residual) as its epilogue, each site on whichever of cuBLAS + the
    #: chain's kernel and the fused GEMM first sight times faster. True: everywhere; False:
    #: nowhere; None (the default): where it measures faster, a compute capability 9.x GPU with
    #: the CuTe DSL GEMM installed (``pip install "sgdiff[gemm]"``; bench/results/rivals.md). With
    #: the Triton GEMM alone Flux.1-dev's step measured slower (bench/results/README.md)
    gemm: Optional[bool] = None
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
            if flag in options and not isinstance(options[flag], bool) and not (flag == "gemm" and options[flag] is None):
                raise ValueError(f"sgdiff option {flag!r} must be True or False, got {options[flag]!r}")
        if mode in NO_CUDAGRAPH_MODES:
            options.setdefault("cudagraphs", False)
        return cls(**options)

    def chosen_families(self, device=None) -> Tuple[str, ...]:
        """The families the passes rewrite for a graph on ``device``: ``families``, or the default
        ones; "gemm" too where ``gemm`` says so (None: where the CuTe DSL GEMM runs on ``device``)."""
        from sgdiff import patterns

        names = self.families if self.families is not None else tuple(patterns.default_families())
        return names + (("gemm",) if self.gemm_on(device) and "gemm" not in names else ())

    def gemm_on(self, device=None) -> bool:
        """Whether the gemm family runs on a graph on ``device`` (None: no device known)."""
        if self.gemm is not None:
            return self.gemm
        from sgdiff.kernels import cute

        return device is not None and cute.runs_on(device)


def _families(value) -> Tuple[str, ...]:
    from sgdiff import patterns

    names = (value,) if isinstance(value, str) else tuple(value)
    known = patterns.families()
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown chain famil{'y' if len(bad) == 1 else 'ies'} {bad}; valid: {', '.join(known)}")
    return names
