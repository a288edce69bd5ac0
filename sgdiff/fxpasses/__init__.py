"""Graph passes: the chain matcher, the family rewrites and the quality-aware pass manager.

Patterns import :mod:`sgdiff.fxpasses.matcher` (the chain vocabulary) while the manager imports
the patterns, so the names below load on first use.
"""
import importlib

_EXPORTS = {
    "PassManager": "sgdiff.fxpasses.manager",
    "PatternPass": "sgdiff.fxpasses.manager",
    "ManagerResult": "sgdiff.fxpasses.manager",
    "PassResult": "sgdiff.fxpasses.rewrite",
    "Skip": "sgdiff.fxpasses.rewrite",
}


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sgdiff.fxpasses' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = list(_EXPORTS)
