"""CUDA's fp32 math functions as ATen's kernels call them, for Triton kernels.

nvcc builds ATen without fast-math: ``rsqrtf`` is ``rsqrt.approx.f32``, ``expf``/``tanhf`` are
libdevice's ``__nv_expf``/``__nv_tanhf`` with denormals kept. Triton's own ``tl.exp`` and
``tl.rsqrt`` are other approximations, so kernels call these instead, passing
``INTERPRET`` as the last argument.

The interpreter (``TRITON_INTERPRET=1``) runs on the CPU without PTX or libdevice; there the
functions fall back to Triton's (numpy's) own, which tests kernel logic but not bits.
"""
from __future__ import annotations

import functools
import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # the smallest normal fp32


@triton.jit
def rsqrtf(x, INTERPRET: tl.constexpr):
    """CUDA's ``rsqrtf`` (rsqrt.approx.f32)."""
    if INTERPRET:
        return 1.0 / tl.sqrt(x)
    else:
        return tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def expf(x, INTERPRET: tl.constexpr):
    """CUDA's ``expf`` (libdevice ``__nv_expf``)."""
    if INTERPRET:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def libdevice_options() -> dict:
    """Launch options for kernels that call libdevice: keep denormals, as nvcc does for ATen
    (Triton flushes them inside libdevice unless told not to, where it can be told)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return {}
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return {"enable_reflect_ftz": False} if "enable_reflect_ftz" in fields else {}


@triton.jit
def tanhf(x, INTERPRET: tl.constexpr):
    """CUDA's ``tanhf``. libdevice's flushes denormal inputs to 0 in Triton's build; CUDA's
    returns them unchanged (tanh(x) == x there), so they pass through."""
    if INTERPRET:
        t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    else:
        t = libdevice.tanh(x)
    return tl.where(tl.abs(x) < FLT_MIN, x, t)
