"""Gluon helpers for values a thread holds in its registers.

A kernel whose layout puts an axis wholly in each thread's registers (the linear-attention
kernels) takes one entry of that axis as ``sum(where(index == i, x, -0.0))``: the index of every
register is known to the compiler, so the select and the additions of -0.0 fold away and the
entry is a register, not a sum across lanes; exact, as ``x + -0.0`` is ``x`` for every x (NaN,
-0.0 included). The -0.0 is made from its bits: the language's ``-0.0`` is ``0.0 - 0.0``, +0.0,
which neither folds nor keeps a -0.0 entry's sign.
"""
from __future__ import annotations

import triton.language as tl

from sgdiff.kernels.triton.triton_compat import gluon_barrier

NEGATIVE_ZERO_BITS = tl.constexpr(-2 ** 31)  # -0.0's bits (0x80000000) as an int32, for Triton and Gluon kernels


def bits(n: int) -> list:
    """The powers of two below ``n`` (a power of two): one basis vector a bit of an index under
    ``n``, as a linear layout lists them."""
    return [1 << i for i in range(n.bit_length() - 1)]


if gluon_barrier is not None:  # Gluon, as the kernels that use these spell it
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def take(x, index, i: gl.constexpr, axis: gl.constexpr):
        """``x``'s entry ``i`` along ``axis`` (``index``: that axis's positions, broadcast to
        ``x``), the axis in each thread's registers."""
        negative_zero = gl.full_like(x, NEGATIVE_ZERO_BITS, dtype=gl.int32).to(gl.float32, bitcast=True)
        return gl.sum(gl.where(index == i, x, negative_zero), axis=axis)

    @gluon.jit
    def relu_as_aten(v):
        """ATen's ``relu`` (``clamp_min(v, 0)``) of fp32 ``v``: NaN passes with its bits, else the max."""
        return gl.where(v != v, v, gl.maximum(v, 0.0))
else:
    gluon = take = relu_as_aten = None
