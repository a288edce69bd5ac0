"""User-facing API: ``optimize`` (decorator), ``explain`` (a Report of what sgdiff does)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from sgdiff import _compat, patterns
from sgdiff.backend import SgdiffBackend
from sgdiff.fxpasses import ManagerResult
from sgdiff.options import Options
from sgdiff.report import Report
from sgdiff.tiers import DEFAULT_TIER, Tier


def optimize(fn: Optional[Callable] = None, *, quality: "Tier | str" = DEFAULT_TIER,
             mode: Optional[str] = None, dynamic: Optional[bool] = None,
             fullgraph: bool = False, **options: Any):
    """Compile a forward function or an ``nn.Module`` with sgdiff.

    ``@sgdiff.optimize`` or ``@sgdiff.optimize(quality="extra-high")``; on a module,
    ``sgdiff.optimize(transformer)``. Other keyword options are backend options
    (see :class:`sgdiff.options.Options`). ``with sgdiff.quality(...)`` switches the tier per call.
    """
    opts = Options.parse({"quality": quality, **options}, mode)  # errors at decoration time

    def wrap(target: Callable):
        return torch.compile(target, backend=SgdiffBackend(opts), dynamic=dynamic, fullgraph=fullgraph)

    return wrap if fn is None else wrap(fn)


def explain(model: Callable, *args: Any, quality: "Tier | str" = DEFAULT_TIER, **kwargs: Any) -> Report:
    """Run ``model(*args, **kwargs)`` once through sgdiff (under ``torch.no_grad``) and report
    what each chain family found and rewrote, and what it skipped and why.

    Like ``torch._dynamo.explain``, this resets torch.compile's caches before and after, so
    the report describes a fresh compilation.
    """
    opts = Options.parse({"quality": quality})
    results: List[ManagerResult] = []
    _compat.reset_dynamo()
    try:
        compiled = torch.compile(model, backend=SgdiffBackend(opts, on_result=results.append))
        with torch.no_grad():
            compiled(*args, **kwargs)
    finally:
        _compat.reset_dynamo()
    return Report.from_results(opts.quality, results, patterns.families())
