"""The Triton internals sgdiff's launches rely on, in one place.

A launch that skips ``kernel[grid](...)`` (:mod:`sgdiff.kernels.triton.launch`) calls the
compiled kernel's own launcher with its function handle and packed metadata, and must step
aside when a launch hook (a profiler) is set; programmatic dependent launches need an option
of the CUDA backend and the compile-time target. Each of these is read here, and each has a
fallback where this Triton lacks it: launches then go through Triton's own path.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

try:
    from triton import knobs as _knobs
except ImportError:  # an older Triton: no direct launches
    _knobs = None

try:
    from triton.language.target_info import cuda_capability_geq  # noqa: F401  (used in @triton.jit code)
    HAS_TARGET_INFO = True
except ImportError:  # an older Triton: kernels cannot ask the target's capability
    cuda_capability_geq = None
    HAS_TARGET_INFO = False

#: whether this Triton's compiled kernels can be launched directly (:func:`direct_launch`)
DIRECT_LAUNCHES = _knobs is not None


def has_cuda_option(name: str) -> bool:
    """Whether this Triton's CUDA backend takes the launch/compile option ``name``."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return name in getattr(CUDAOptions, "__dataclass_fields__", {})


def launch_hooked() -> bool:
    """Whether a launch hook is set (a plain callable, or a non-empty chain of them)."""
    if _knobs is None:
        return False
    enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


def direct_launch(compiled: Any) -> Optional[Tuple[Any, Any, Any]]:
    """``(run, function, packed_metadata)`` of a compiled kernel, for
    ``run(gx, gy, gz, stream, function, packed_metadata, None, None, None, *args)``; None where
    this Triton's compiled kernels lack them."""
    try:
        return compiled.run, compiled.function, compiled.packed_metadata  # run loads the module on this device
    except (AttributeError, KeyError, TypeError):
        return None


def ensure_allocator() -> None:
    """Give Triton an allocator for kernels that build TMA descriptors on the device (their
    scratch memory), from torch's caching allocator, unless one is set already. Under CUDA-graph
    capture the scratch comes from the graph's pool, as every other allocation there."""
    import triton

    try:
        from triton.runtime import _allocation
    except ImportError:  # an older Triton: nothing to set
        return
    import contextvars

    current = getattr(_allocation, "_allocator", None)
    if isinstance(current, contextvars.ContextVar):
        current = current.get()
    if current is not None and type(current).__name__ != "NullAllocator":
        return
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)


try:  # Triton's layout-explicit dialect (triton >= 3.5)
    from triton.experimental.gluon import language as _gl
except ImportError:
    _gl = None

#: Gluon's barrier of a program's threads, as this Triton spells it (``thread_barrier`` to 3.6)
gluon_barrier = None if _gl is None else getattr(_gl, "barrier", None) or getattr(_gl, "thread_barrier", None)
