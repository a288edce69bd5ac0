"""sgdiff: a torch.compile backend for diffusion transformers.

    torch.compile(transformer, backend="sgdiff")                       # lossless: torch.equal to eager
    torch.compile(transformer, backend="sgdiff", options={"quality": "high"})
    sgdiff.explain(transformer, **inputs)                              # what it found and rewrote

Attributes load on first use, so ``import sgdiff`` stays cheap and importing
``sgdiff.kernels.registry`` pulls in neither triton nor any kernel.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "optimize": "sgdiff.api",
    "explain": "sgdiff.api",
    "refresh_weights": "sgdiff.api",
    "Report": "sgdiff.report",
    "quality": "sgdiff.tiers",
    "Tier": "sgdiff.tiers",
    "Contract": "sgdiff.tiers",
    "Options": "sgdiff.options",
    "sgdiff_backend": "sgdiff.backend",
    "PassManager": "sgdiff.fxpasses",
    "ChainPattern": "sgdiff.patterns",
    "register_pattern": "sgdiff.patterns",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sgdiff' has no attribute {name!r}")
    attr = "register" if name == "register_pattern" else name
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = list(_EXPORTS)
