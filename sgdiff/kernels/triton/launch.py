"""Triton launches with little host time.

``kernel[grid](*args, **kwargs)`` binds and specializes every argument again on every call:
tens of µs of host time per launch (bench/results/README.md), more than the GPU time of
a short-row kernel, so a model that is host-bound without CUDA graphs (Sana at batch 2) would
lose wall time to the kernels that save it GPU time. :class:`LeanKernel` keeps Triton's
compiled kernel per *launch key* and calls its launch function directly (about 6 µs).

The key holds everything Triton specializes on, and more: the device, the grid, each tensor's
dtype and 16-byte alignment, the exact value of every other argument and option. The first
launch of a key compiles through Triton's own ``warmup`` (so Triton decides the
specialization), and every launch, the first included, goes through the same direct call, so
the first-sight verification of :mod:`sgdiff.kernels.dispatch` checks the path that runs.

Under the interpreter, with launch hooks set (a profiler such as proton), or on a Triton whose
internals differ, it launches the usual way.

On Hopper and later every launch is a programmatic dependent launch (PDL): the GPU may start a
kernel's programs while the kernel before it in the stream finishes, and each program calls
:func:`grid_dependency_wait` before it touches memory, which returns once that kernel has
completed and its writes are visible. Only the launch and the index arithmetic overlap the
previous kernel, never a read or a write, so the bits are those of a plain launch; what it
saves depends on the kernel before. The next kernel is never let in early
(``griddepcontrol.launch_dependents``): its programs would wait on the SMs, and every kernel
measured was slower (both measured: bench/results/README.md). ``SGDIFF_DEPENDENT_LAUNCHES=0``
launches plainly.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from typing import Any, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from sgdiff import _compat
from sgdiff.kernels.triton import triton_compat
from sgdiff.kernels.triton.cuda_math import INTERPRET, INTERPRET_C
from sgdiff.kernels.triton.triton_compat import cuda_capability_geq, launch_hooked

log = logging.getLogger("sgdiff")

PDL = triton_compat.HAS_TARGET_INFO and triton_compat.has_cuda_option("launch_pdl")


PDL_CAPABILITY = (9, 0)  # griddepcontrol and programmatic launches: Hopper and later

if PDL:
    @triton.jit
    def grid_dependency_wait():
        """Wait until the kernel launched before this one has completed and its writes are
        visible (``griddepcontrol.wait``). Every LeanKernel calls it before its first load or
        store."""
        if not INTERPRET_C:
            if cuda_capability_geq(9, 0):  # PDL_CAPABILITY
                tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                                          pack=1)
else:
    @triton.jit
    def grid_dependency_wait():
        pass


@functools.lru_cache(maxsize=None)
def dependent_launches(device: int) -> bool:
    """Whether launches on this CUDA device are programmatic dependent launches."""
    return PDL and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= PDL_CAPABILITY


_plain = [os.environ.get("SGDIFF_DEPENDENT_LAUNCHES", "1") == "0"]  # SGDIFF_DEPENDENT_LAUNCHES=0: none


def launch_options(kwargs: dict) -> dict:
    """A LeanKernel's keyword arguments with ``launch_pdl`` where the current device takes it."""
    if PDL and not INTERPRET and not _plain[-1] and dependent_launches(current_device()):
        return {**kwargs, "launch_pdl": True}
    return kwargs


@contextlib.contextmanager
def plain_launches():
    """Launches (bound from here on) wait for the previous kernel in the stream to finish before
    they start, as without PDL: the same kernels, each after the last (for timing the overlap)."""
    _plain.append(True)
    try:
        yield
    finally:
        _plain.pop()


current_device = _compat.current_cuda_device
raw_stream = _compat.current_raw_stream


class LeanKernel:
    """A ``@triton.jit`` kernel launched as ``lean[grid](*args, **kwargs)``, like the kernel itself.

    Positional arguments fill the kernel's leading parameters; keyword arguments name the rest
    (constexprs included) and Triton's options (``num_warps``, ...)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        params = inspect.signature(fn.fn).parameters
        self._names = tuple(params)
        self._defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        self._launches: Dict[tuple, tuple] = {}
        self._direct = not INTERPRET and triton_compat.DIRECT_LAUNCHES

    def __getitem__(self, grid):
        return functools.partial(self._launch, tuple(grid))

    def bind(self, grid, **kwargs: Any) -> "BoundKernel":
        """``self[grid]`` with these keyword arguments, for calls whose other arguments keep
        their dtypes, alignments and values (:class:`BoundKernel`)."""
        return BoundKernel(self, tuple(grid), kwargs)

    def _launch(self, grid: Tuple[int, ...], *args: Any, **kwargs: Any):
        kwargs = launch_options(kwargs)
        entry = self._entry(grid, args, kwargs)
        if entry is None:
            return self.fn[grid](*args, **kwargs)
        run, g0, g1, g2, function, metadata, tail = entry
        run(g0, g1, g2, raw_stream(current_device()), function, metadata, None, None, None, *args, *tail)

    def _entry(self, grid: Tuple[int, ...], args: tuple, kwargs: dict) -> Optional[tuple]:
        """What a direct launch of these arguments needs, or None where it launches Triton's way."""
        if not self._direct or launch_hooked():
            return None
        key = (current_device(), grid,
               *[(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args],
               *kwargs.items())
        try:
            entry = self._launches.get(key)
        except TypeError:  # an unhashable argument: nothing to key on
            return None
        return entry if entry is not None else self._prepare(key, grid, args, kwargs)

    def _prepare(self, key: tuple, grid, args: tuple, kwargs: dict):
        """Compile through Triton (no launch) and keep what a direct launch needs."""
        warmup = getattr(self.fn, "warmup", None)
        compiled = warmup(*args, grid=grid, **kwargs) if warmup is not None else None  # errors as a launch's
        direct = triton_compat.direct_launch(compiled) if compiled is not None else None
        if direct is None:  # a Triton without these internals: the usual way
            self._direct = False
            log.info("sgdiff: launching %s through Triton's own launcher", self.__name__)
            return None
        run, function, metadata = direct
        tail = tuple(kwargs[n] if n in kwargs else self._defaults[n] for n in self._names[len(args):])
        entry = (run, *grid, *(1,) * (3 - len(grid)), function, metadata, tail)
        self._launches[key] = entry
        return entry


class BoundKernel:
    """A launch of one kernel on one grid whose arguments keep, call after call, their dtypes,
    their 16-byte alignment and the values of the non-tensor ones: one call site of a compiled
    graph (:class:`sgdiff.kernels.dispatch.CallSite`). The first call looks its compiled
    kernel up as :class:`LeanKernel` does; later calls launch it without building the key."""

    __slots__ = ("kernel", "grid", "kwargs", "entry", "device")

    def __init__(self, kernel: LeanKernel, grid: Tuple[int, ...], kwargs: dict):
        self.kernel, self.grid, self.kwargs = kernel, grid, kwargs
        self.entry, self.device = None, None

    def __call__(self, *args: Any):
        entry = self.entry
        if entry is None or current_device() != self.device or launch_hooked():
            kwargs = launch_options(self.kwargs)
            entry = self.kernel._entry(self.grid, args, kwargs)
            if entry is None:
                return self.kernel.fn[self.grid](*args, **kwargs)
            self.entry, self.device = entry, current_device()
        run, g0, g1, g2, function, metadata, tail = entry
        run(g0, g1, g2, raw_stream(self.device), function, metadata, None, None, None, *args, *tail)


def fresh_output(kernel: BoundKernel, inputs: int, shape, strides, dtype, *tail):
    """``launch(*tensors, ...)`` of a kernel that reads its first ``inputs`` arguments and writes
    a fresh tensor of this geometry, on the first one's device: ``kernel(*tensors, out, *tail)``."""
    def launch(*args):
        out = torch.empty_strided(shape, strides, dtype=dtype, device=args[0].device)
        kernel(*args[:inputs], out, *tail)
        return out

    return launch
