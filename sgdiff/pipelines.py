"""Diffusers pipelines: the components sgdiff compiles, and explain per component.

A pipeline (anything with diffusers' ``components`` dict that is not itself a module) runs a
denoiser (``transformer``, or ``unet``) for every step and then ``vae.decode`` (``vae.encode``
first where an image goes in). :func:`optimize_pipeline` compiles those in place: the denoiser
whole, or block by block with ``regional=True`` where the model declares repeated blocks
(diffusers' ``compile_repeated_blocks``), and the VAE's ``decode`` and ``encode`` (compiled
lazily: one the pipeline never calls costs nothing). The VAE may get compile options of its own:
:func:`sgdiff.optimize` runs it without CUDA graphs unless asked, since it runs once per call and a
captured decode would keep its working memory (GiBs for a video) reserved through every later
denoising loop. :func:`explain_pipeline` runs the pipeline once with each of those recorded by a
backend of its own and puts them back as they were.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

DENOISERS = ("transformer", "unet")
VAE_METHODS = ("decode", "encode")


def is_pipeline(obj: Any) -> bool:
    return not isinstance(obj, torch.nn.Module) and isinstance(getattr(obj, "components", None), dict)


def _denoisers(pipe) -> List[str]:
    return [name for name in DENOISERS if isinstance(getattr(pipe, name, None), torch.nn.Module)]


def _vae(pipe):
    vae = getattr(pipe, "vae", None)
    return vae if isinstance(vae, torch.nn.Module) else None


def optimize_pipeline(pipe, compile_kwargs: Dict[str, Any], regional: bool = False,
                      vae_compile_kwargs: Optional[Dict[str, Any]] = None):
    """Compile ``pipe``'s denoiser in place with ``torch.compile(**compile_kwargs)`` and its VAE's
    methods with ``vae_compile_kwargs`` (default: the same); return ``pipe``."""
    names = _denoisers(pipe)
    if not names:
        raise ValueError(f"{type(pipe).__name__} has no denoiser among {', '.join(DENOISERS)}: nothing to compile")
    for name in names:
        module = getattr(pipe, name)
        if regional and getattr(module, "_repeated_blocks", None):
            module.compile_repeated_blocks(**compile_kwargs)
        else:
            setattr(pipe, name, torch.compile(module, **compile_kwargs))
    vae = _vae(pipe)
    for method in VAE_METHODS if vae is not None else ():
        if hasattr(vae, method):
            setattr(vae, method, torch.compile(getattr(vae, method), **(vae_compile_kwargs or compile_kwargs)))
    return pipe


@dataclasses.dataclass
class PipelineReport:
    """One :class:`~sgdiff.report.Report` per compiled part of a pipeline ("transformer",
    "vae.decode", ...), and the graph breaks of the whole run."""

    parts: Dict[str, Any]
    graph_breaks: List[str] = dataclasses.field(default_factory=list)

    def __getitem__(self, part: str):
        return self.parts[part]

    def __str__(self) -> str:
        lines = [f"sgdiff pipeline report: {', '.join(self.parts)}"
                 + (f"; {len(self.graph_breaks)} kind(s) of graph break" if self.graph_breaks else "")]
        return "\n".join(lines + [f"[{part}] {report}" for part, report in self.parts.items()])


@contextlib.contextmanager
def recorded_parts(pipe, record: Callable[[str, Callable], Callable]) -> Iterator[List[str]]:
    """Within the block, each part of ``pipe`` runs ``record(part, original)(*args, **kwargs)``:
    the denoiser's uncompiled module with its ``forward`` replaced, the VAE's methods replaced on
    the instance. Everything is put back afterwards, compiled parts included."""
    undo: List[Callable[[], None]] = []
    parts: List[str] = []
    try:
        for name in _denoisers(pipe):
            current = getattr(pipe, name)
            module = getattr(current, "_orig_mod", current)  # a torch.compile'd module: the module it wraps
            original = module.forward
            module.forward = record(name, original)
            undo.append(lambda module=module: module.__dict__.pop("forward", None))
            if module is not current:
                setattr(pipe, name, module)
                undo.append(lambda name=name, current=current: setattr(pipe, name, current))
            parts.append(name)
        vae = _vae(pipe)
        for method in VAE_METHODS if vae is not None else ():
            if not hasattr(type(vae), method):
                continue
            had = vae.__dict__.get(method)
            setattr(vae, method, record(f"vae.{method}", getattr(type(vae), method).__get__(vae)))
            undo.append(lambda method=method, had=had: setattr(vae, method, had) if had is not None
                        else vae.__dict__.pop(method, None))
            parts.append(f"vae.{method}")
        yield parts
    finally:
        for step in reversed(undo):
            step()
