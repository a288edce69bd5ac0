"""Backend options: one typed object, unknown keys rejected with the valid ones named."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from sgdiff.tiers import DEFAULT_TIER, Tier

#: torch.compile's mode names, as sgdiff reads them: "reduce-overhead" and "max-autotune" (which
#: turns CUDA graphs on in Inductor too) run the graph under CUDA graphs; "default" and
#: "max-autotune-no-cudagraphs" do not. (sgdiff has no GEMM of its own to autotune yet.)
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclasses.dataclass(frozen=True)
class Options:
    #: quality tier: "lossless" (default; output torch.equal to eager), "extra-high", "high"
    quality: Tier = DEFAULT_TIER
    #: run the rewritten graph under CUDA graphs; ``mode="reduce-overhead"`` sets it
    cudagraphs: bool = False
    #: rewrite only these chain families (None: all); e.g. ("modulate",)
    families: Optional[Tuple[str, ...]] = None
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
        for flag in ("cudagraphs", "verify"):
            if flag in options and not isinstance(options[flag], bool):
                raise ValueError(f"sgdiff option {flag!r} must be True or False, got {options[flag]!r}")
        if mode in CUDAGRAPH_MODES:
            options["cudagraphs"] = True
        return cls(**options)


def _families(value) -> Tuple[str, ...]:
    from sgdiff import patterns

    names = (value,) if isinstance(value, str) else tuple(value)
    known = patterns.families()
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown chain famil{'y' if len(bad) == 1 else 'ies'} {bad}; valid: {', '.join(known)}")
    return names
