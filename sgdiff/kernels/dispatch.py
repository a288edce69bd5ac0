"""Runtime choice of an op's implementation.

The custom op's device kernel calls :func:`run`. It walks the op's KernelSpecs in priority
order and takes the first that supports the input's device and dtype and whose ``can_use``
accepts the inputs; the reference implementation (the eager chain) supports everything and
comes last, so an input no kernel handles falls back to eager numerics instead of failing.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, Tuple

import torch

from sgdiff.kernels import registry

log = logging.getLogger("sgdiff")

_disabled: Dict[Tuple[str, str], str] = {}  # (op, backend) -> reason


def disable(op: str, backend: str, reason: str) -> None:
    """Stop using one implementation of one op for the rest of the process."""
    if (op, backend) not in _disabled:
        _disabled[(op, backend)] = reason
        log.warning("sgdiff: %s implementation of %s disabled: %s", backend, op, reason)


def disabled() -> Dict[Tuple[str, str], str]:
    return dict(_disabled)


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def _impls(op: str, device: torch.device, dtype: torch.dtype):
    cap = _capability(device.index or 0) if device.type == "cuda" else None
    dtype_name = str(dtype).removeprefix("torch.")
    for spec in registry.kernel_specs(op):
        if (op, spec.backend) in _disabled or not spec.supports(device.type, dtype_name, cap):
            continue
        yield spec, _load(spec)


@functools.lru_cache(maxsize=None)
def _load(spec: registry.KernelSpec) -> Callable:
    return spec.load()


def run(op: str, x: torch.Tensor, *args):
    """Run ``op`` on ``(x, *args)`` with the best implementation that accepts them."""
    for spec, impl in _impls(op, x.device, x.dtype):
        can_use = getattr(impl, "can_use", None)
        if spec.backend == "reference" or can_use is None or can_use(x, *args):
            return impl(x, *args)
    raise RuntimeError(f"no implementation of sgdiff::{op} for {x.device.type} {x.dtype}")
