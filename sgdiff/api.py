"""User-facing API: ``optimize`` (decorator, module or diffusers pipeline), ``explain`` (a
Report of what sgdiff does, per part for a pipeline)."""
from __future__ import annotations

import contextlib
import dataclasses

from typing import Any, Callable, Dict, List, Optional

import torch

from sgdiff import _compat, patterns, pipelines
from sgdiff.backend import SgdiffBackend
from sgdiff.fxpasses import ManagerResult
from sgdiff.kernels import dispatch
from sgdiff.options import Options
from sgdiff.report import Report
from sgdiff.tiers import DEFAULT_TIER, Tier


def optimize(fn: Optional[Callable] = None, *, quality: "Tier | str" = DEFAULT_TIER,
             mode: Optional[str] = None, dynamic: Optional[bool] = None,
             fullgraph: bool = False, regional: bool = False, **options: Any):
    """Compile a forward function, an ``nn.Module`` or a diffusers pipeline with sgdiff.

    ``@sgdiff.optimize`` or ``@sgdiff.optimize(quality="extra-high")``; on a module,
    ``sgdiff.optimize(transformer)``; on a pipeline, ``sgdiff.optimize(pipe)`` compiles its
    denoiser and its VAE's ``decode`` and ``encode`` in place and returns the pipeline
    (:mod:`sgdiff.pipelines`). ``regional=True``: a denoiser with repeated blocks is compiled
    block by block (diffusers' ``compile_repeated_blocks``). Other keyword options are backend
    options (see :class:`sgdiff.options.Options`). ``with sgdiff.quality(...)`` switches the
    tier per call.
    """
    opts = Options.parse({"quality": quality, **options}, mode)  # errors at decoration time
    compile_kwargs = dict(backend=SgdiffBackend(opts), dynamic=dynamic, fullgraph=fullgraph)

    def _vae_compile_kwargs():
        """A pipeline's VAE runs once per call: no CUDA graphs for it unless asked for (the
        ``cudagraphs`` option, or ``mode="reduce-overhead"``). A video decode's launches hide
        behind its large convolutions (Wan 2.1's 480p x 81 decode on an H100: 1.49 s replayed,
        1.50 s run directly) while a replay's pool would keep the decode's working memory reserved
        through every later denoising loop (11.2 GiB reserved there, against 7.4)."""
        if "cudagraphs" in options or mode == "reduce-overhead":
            return compile_kwargs
        return dict(compile_kwargs, backend=SgdiffBackend(dataclasses.replace(opts, cudagraphs=False)))

    def wrap(target: Callable):
        if pipelines.is_pipeline(target):
            return pipelines.optimize_pipeline(target, compile_kwargs, regional, _vae_compile_kwargs())
        if regional and getattr(target, "_repeated_blocks", None):
            target.compile_repeated_blocks(**compile_kwargs)
            return target
        return torch.compile(target, **compile_kwargs)

    return wrap if fn is None else wrap(fn)


def _explained_call(model: Callable, args: tuple, kwargs: dict):
    return model(*args, **kwargs)


def _recording(opts: Options, found: List[ManagerResult]) -> Callable:
    """``_explained_call`` compiled by a backend of its own that appends each graph's result to ``found``;
    static (``dynamic=False``): every explain traces from this one frame, so torch.compile's automatic
    dynamic would otherwise give a model explained after another at other sizes symbolic ones."""
    return torch.compile(_explained_call, backend=SgdiffBackend(opts, on_result=found.append), dynamic=False)


@contextlib.contextmanager
def _explaining(breaks: List[str]):
    """What every explain runs under: no grad, no recompile limit, graph breaks recorded."""
    with torch.no_grad(), _compat.explain_recompiles(), _compat.graph_breaks(breaks):
        yield


def explain(model: Callable, *args: Any, quality: "Tier | str" = DEFAULT_TIER, options: Optional[dict] = None,
            **kwargs: Any) -> Report:
    """Run ``model(*args, **kwargs)`` once through sgdiff (under ``torch.no_grad``) and report
    what each chain family found and rewrote, and what it skipped and why. ``options``: the
    backend's (:class:`sgdiff.options.Options`), e.g. ``{"gemm": True}``.

    The report describes a fresh compilation (a backend of its own, which torch.compile's
    caches never share with another), and torch.compile's caches are left as they are: a
    model the user compiled before keeps its compiled code and does not recompile (each
    explain adds its own entries beside them, past torch.compile's recompile limit). ``model``
    may be such a compiled model (``torch.compile(m, ...)``): ``m`` is what is explained.
    The compile starts at a frame of explain's own (the model's code traced into it), so the
    cache entries it leaves sit on that frame's code, not on the model's, unless a graph break
    in the model makes torch.compile resume in the model's own frames.
    """
    opts = Options.parse({"quality": quality, **(options or {})})
    if pipelines.is_pipeline(model):
        return _explain_pipeline(model, opts, args, kwargs)
    results: List[ManagerResult] = []
    breaks: List[str] = []
    before = set(dispatch.tuned_choices())
    with _explaining(breaks):
        _recording(opts, results)(_compat.uncompiled(model), args, kwargs)
    report = Report.from_results(opts.quality, results, patterns.families(), graph_breaks=breaks)
    report.choices = dispatch.first_sight_report(exclude=before)
    return report


def _explain_pipeline(pipe, opts: Options, args: tuple, kwargs: dict) -> "pipelines.PipelineReport":
    """Run the pipeline once, each part through a recording backend of its own; a Report per part."""
    results: Dict[str, List[ManagerResult]] = {}

    def record(part: str, original: Callable) -> Callable:
        compiled = _recording(opts, results.setdefault(part, []))
        return lambda *a, **k: compiled(original, a, k)

    breaks: List[str] = []
    with pipelines.recorded_parts(pipe, record) as parts, _explaining(breaks):
        pipe(*args, **kwargs)
    reports = {part: Report.from_results(opts.quality, results.get(part, []), patterns.families()) for part in parts}
    return pipelines.PipelineReport(reports, breaks)


def refresh_weights() -> int:
    """Remake the copies sgdiff keeps of weights (at ``high``, each FP8 GEMM's e4m3 weight) from
    the weights as they are now, in their own memory (CUDA graphs that read them read the new
    ones). An in-place update (``with torch.no_grad(): w.add_(d)``) or a new tensor
    (``w.data = ...``) is seen on its own; an edit through ``w.data`` in place (PEFT's
    ``fuse_lora`` and ``unfuse_lora``) changes neither the weight's address nor its version: call
    this after it. Returns how many copies were remade."""
    return dispatch.refresh_input_copies()
