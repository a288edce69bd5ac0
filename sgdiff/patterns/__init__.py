"""The chain patterns sgdiff knows, one module per family, and the extension point.

A family module declares ``FAMILY = Family(name, after=...)`` and ``patterns()``; nothing lists
the modules: the first question about patterns imports every module of this package that
declares a family. ``register(pattern)`` adds a :class:`ChainPattern` of your own; the pass
manager applies it like the built-in ones (its op must be registered in
:mod:`sgdiff.kernels.registry`).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Iterable, List, Optional

from sgdiff.patterns.base import ChainPattern, Family

_registered: Dict[str, ChainPattern] = {}
_families: Dict[str, Family] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, Family):
            _families[family.name] = family
            for p in module.patterns():
                register(p)


def _ordered(families: Dict[str, Family]) -> List[str]:
    """Family names with every family after those it names in ``after`` (ties by name)."""
    done: List[str] = []
    pending = sorted(families)
    while pending:
        ready = [f for f in pending if all(a in done or a not in families for a in families[f].after)]
        if not ready:
            raise ValueError(f"pattern families order each other in a cycle: {pending}")
        done.append(ready[0])
        pending.remove(ready[0])
    return done


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
    """Every family in the order the pass manager applies them: the built-in ones as their
    modules order them, then those only registered patterns name, by name."""
    _load_builtins()
    builtin = _ordered(_families)
    return builtin + sorted({p.family for p in _registered.values()} - set(builtin))


def default_families() -> List[str]:
    """The families rewritten when the options name none: all but those declared
    ``default=False`` (:class:`Family`), in :func:`families`' order."""
    _load_builtins()
    return [f for f in families() if f not in _families or _families[f].default]


__all__ = ["ChainPattern", "Family", "register", "unregister", "all_patterns", "families", "default_families"]
