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


def _explained_call(model: Callable, args: tuple, kwargs: dict):
    return model(*args, **kwargs)


def explain(model: Callable, *args: Any, quality: "Tier | str" = DEFAULT_TIER, **kwargs: Any) -> Report:
    """Run ``model(*args, **kwargs)`` once through sgdiff (under ``torch.no_grad``) and report
    what each chain family found and rewrote, and what it skipped and why.

    The report describes a fresh compilation (a backend of its own, which torch.compile's
    caches never share with another), and torch.compile's caches are left as they are: a
    model the user compiled before keeps its compiled code and does not recompile (each
    explain adds its own entries beside them, past torch.compile's recompile limit). ``model``
    may be such a compiled model (``torch.compile(m, ...)``): ``m`` is what is explained.
    The compile starts at a frame of explain's own (the model's code traced into it), so the
    cache entries it leaves sit on that frame's code, not on the model's, unless a graph break
    in the model makes torch.compile resume in the model's own frames.
    """
    opts = Options.parse({"quality": quality})
    results: List[ManagerResult] = []
    compiled = torch.compile(_explained_call, backend=SgdiffBackend(opts, on_result=results.append))
    breaks: List[str] = []
    with torch.no_grad(), _compat.explain_recompiles(), _compat.graph_breaks(breaks):
        compiled(_compat.uncompiled(model), args, kwargs)
    return Report.from_results(opts.quality, results, patterns.families(), graph_breaks=breaks)
