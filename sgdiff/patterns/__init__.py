"""The chain patterns sgdiff knows, one module per family, and the extension point.

``register(pattern)`` adds a :class:`ChainPattern` of your own; the pass manager applies it
like the built-in ones (its op must be registered in :mod:`sgdiff.kernels.registry`).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from sgdiff.patterns.base import FAMILIES, ChainPattern

_registered: Dict[str, ChainPattern] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    from sgdiff.patterns import activation, linear_attention, modulate, qk_norm, residual_gate, rope

    for module in (modulate, residual_gate, rope, qk_norm, activation, linear_attention):
        for p in module.patterns():
            register(p)


def register(pattern: ChainPattern, *, replace: bool = False) -> ChainPattern:
    """Add a pattern. Its ``name`` must be new unless ``replace=True``."""
    if not isinstance(pattern, ChainPattern):
        raise TypeError(f"expected a ChainPattern, got {type(pattern).__name__}")
    if pattern.name in _registered and not replace and _registered[pattern.name] is not pattern:
        raise ValueError(f"a pattern named {pattern.name!r} is already registered")
    _registered[pattern.name] = pattern
    return pattern


def unregister(name: str) -> None:
    _registered.pop(name, None)


def all_patterns(families: Optional[Iterable[str]] = None) -> List[ChainPattern]:
    """Registered patterns (built-ins first loaded), larger chains first."""
    _load_builtins()
    wanted = None if families is None else set(families)
    found = [p for p in _registered.values() if wanted is None or p.family in wanted]
    return sorted(found, key=lambda p: -p.priority)


def families() -> List[str]:
    _load_builtins()
    extra = sorted({p.family for p in _registered.values()} - set(FAMILIES))
    return list(FAMILIES) + extra


__all__ = ["ChainPattern", "register", "unregister", "all_patterns", "families", "FAMILIES"]
