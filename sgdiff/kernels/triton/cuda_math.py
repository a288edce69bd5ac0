"""CUDA's fp32 math functions as ATen's kernels call them, for Triton kernels.

nvcc builds ATen without fast-math: ``rsqrtf`` is ``rsqrt.approx.f32``, ``expf``/``tanhf`` are
libdevice's ``__nv_expf``/``__nv_tanhf`` with denormals kept (``tanhf`` here is written out
without libdevice's branches). Triton's own ``tl.exp`` and ``tl.rsqrt`` are other
approximations, so kernels call these instead, passing ``INTERPRET`` as the last argument.
``tests/gpu/test_cuda_math_gpu.py`` compares them with ATen's over every fp32 value, and
``silu_rounded`` (ATen's SiLU where only its rounding to 16 bits must match) over every bf16
and fp16 value.

The interpreter (``TRITON_INTERPRET=1``) runs on the CPU without PTX or libdevice; there the
functions fall back to Triton's (numpy's) own, which tests kernel logic but not bits.
"""
from __future__ import annotations

import functools
import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from sgdiff.kernels.triton.triton_compat import has_cuda_option

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRET_C = tl.constexpr(INTERPRET)  # the same, for functions that cannot take it as an argument


@triton.jit
def _ptx(x, ASM: tl.constexpr):
    """The PTX instruction ``ASM`` (``$0`` its fp32 result, ``$1`` ``x``) per element."""
    return tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _approx(x, OP: tl.constexpr):
    """One PTX instruction ``OP`` (an approximate unary op) per fp32 element."""
    return _ptx(x, OP + " $0, $1;")


@triton.jit
def rsqrtf(x, INTERPRET: tl.constexpr):
    """CUDA's ``rsqrtf`` (rsqrt.approx.f32)."""
    if INTERPRET:
        return 1.0 / tl.sqrt(x)
    else:
        return _approx(x, "rsqrt.approx.f32")


@triton.jit
def fast_sigmoid_scale(x, t, INTERPRET: tl.constexpr):
    """``x / (1 + 2^t)`` with the hardware's approximate ``ex2`` and reciprocal (flushing kind;
    about 2^-22 relative each), for the fast forms of approximate tiers (not CUDA's math): a
    zero of ``x``'s sign where ``2^t`` overflows, ``x`` where it underflows."""
    if INTERPRET:
        return x * (1.0 / (1.0 + tl.math.exp2(t)))
    else:
        return x * _approx(1.0 + _approx(t, "ex2.approx.ftz.f32"), "rcp.approx.ftz.f32")


@triton.jit
def count_reciprocal(n):
    """``1 / n``, IEEE-rounded as ``div.rn`` gives it, for counts: integers 0 < n < 2**24 held in
    fp32 (0 gives NaN). ``div.rn``'s own fast path (rcp, a Newton step, the rounding
    correction), whose range check always passes for such n, without its slow-path branch."""
    if INTERPRET_C:
        return tl.math.div_rn(tl.full(n.shape, 1.0, tl.float32), n)
    else:
        r = _approx(n, "rcp.approx.ftz.f32")
        r = tl.fma(r, tl.fma(n * -1.0, r, 1.0), r)
        return tl.fma(r, tl.fma(n * -1.0, r, 1.0), r)


@triton.jit
def to_e4m3(x):
    """fp32 ``x`` (within ±448) rounded to e4m3, to nearest even, as ``cvt.rn.satfinite`` does.
    The interpreter's cast rounds wrong where the mantissa carries into the exponent (31.5 to
    16) and flushes e4m3's subnormals, so there ``x`` is first rounded on the e4m3 grid in fp32:
    3 mantissa bits for normals, steps of 2^-9 below 2^-6; the cast is then exact."""
    if INTERPRET_C:
        b = x.to(tl.uint32, bitcast=True)
        normal = ((b + 0x7FFFF + ((b >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        x = tl.where(tl.abs(x) < 0.015625, (x + 24576.0) - 24576.0, normal)  # 24576's ulp is 2^-9
    return x.to(tl.float8e4nv)


@triton.jit
def to_fp32(x):
    """``x.to(float32)``. A bf16 pair held in one 32-bit register widens in two instructions
    (a shift for the low half, a mask for the high one) where the plain conversion takes
    three (ptxas extracts the high half first)."""
    if x.dtype == tl.bfloat16 and not INTERPRET_C:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)
    return x.to(tl.float32)


@triton.jit
def expf(x, INTERPRET: tl.constexpr):
    """CUDA's ``expf`` (libdevice ``__nv_expf``)."""
    if INTERPRET:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def expf_parts(x, NEGATE: tl.constexpr = False):
    """``(p, s)`` with CUDA's ``expf(x)`` (of ``-x`` with ``NEGATE``) = ``p * s``: libdevice's
    ``__nv_expf`` step for step, its last product left to the caller (``s`` a power of two, so
    ``fma(p, s, c)`` rounds as ``expf(x) + c`` does, in one instruction where the product and
    the sum take two). ``k``, the power of ``s`` (clamped, and rounded down by fma.rm in 2**23's
    magic form), splits ``x log2(e)`` (in two parts) into ``k + f``; ``p = ex2.approx(f)``.
    Compiled kernels only (inline PTX)."""
    if NEGATE:  # the sign in the constant: an inline instruction's operand takes no negation
        t = _ptx(x, "fma.rn.sat.f32 $0, $1, 0fBBBB989D, 0f3F000000;")
        x = x * -1.0
    else:
        t = _ptx(x, "fma.rn.sat.f32 $0, $1, 0f3BBB989D, 0f3F000000;")  # x log2(e) / 252 + 1 / 2
    t = _ptx(t, "fma.rm.f32 $0, $1, 0f437C0000, 0f4B400001;")  # k + 2**23 + 2**22 + 1
    f = tl.fma(x, 1.4426950216293334961, 12583039.0 - t)  # x log2(e) - k, in two parts
    f = tl.fma(x, 1.925963033500011079e-08, f)
    s = (t.to(tl.uint32, bitcast=True) << 23).to(tl.float32, bitcast=True)
    return _approx(f, "ex2.approx.ftz.f32"), s


@triton.jit
def silu_rounded(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """ATen's fp32 SiLU of ``x``, ``x / (1 + expf(-x))`` with an IEEE division, rounded to DTYPE.

    Rounded to bf16 or fp16 (``x`` a value of that dtype, as the caller guarantees), the fp32
    quotient need not be IEEE's, only round as IEEE's does, and for those 65536 inputs each
    a cheaper one does (``tests/gpu/test_cuda_math_gpu.py`` compares every one with ``F.silu``):
    ``rcp.approx`` of the denominator and div.rn's correction step, without div.rn's range
    check and its per-element slow path, which costs 12% at Sana's GLU. Both operands are
    quartered (exactly: a 16-bit value's last bit stays above fp32's), which keeps the
    reciprocal of denominators up to 2**128 (x down to -88.7) normal; the residual is taken
    negated (``b q0 - a``), which keeps a zero quotient's sign through the correction; where it
    is NaN (an infinite operand) the uncorrected quotient stands; and ``1 + expf(-x)`` is one
    fma (:func:`expf_parts`). Against a scale of 2**-64 chosen for large denominators, a check
    of the quotient for 0 and a product and a sum, 5 fewer SASS instructions an element (what
    that saved: bench/results/README.md). fp32 results take ``div.rn``."""
    if INTERPRET or DTYPE == tl.float32:
        d = 1.0 + expf(x * -1.0, INTERPRET)
        q = tl.math.div_rn(x, d)
    else:
        p, s = expf_parts(x, NEGATE=True)
        b = tl.fma(p, s, 1.0) * 0.25
        a = x * 0.25
        r = _approx(b, "rcp.approx.ftz.f32")
        q0 = a * r
        q = tl.fma(tl.fma(b, q0, a * -1.0) * -1.0, r, q0)
        q = tl.where(q == q, q, q0)
    return q.to(DTYPE)


@triton.jit
def dot_acc(a, b, acc):
    """``acc + a @ b`` accumulated in fp32 on the tensor cores. The interpreter's dot mistakes
    16-bit operands, so there it takes them converted to fp32 (exactly: e4m3 and 16-bit values
    are fp32 values), which leaves the products exact as on the GPU and the order of the sums
    numpy's."""
    if INTERPRET_C:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@functools.lru_cache(maxsize=None)
def libdevice_options() -> dict:
    """Launch options for kernels that call libdevice: keep denormals, as nvcc does for ATen
    (Triton flushes them inside libdevice unless told not to, where it can be told)."""
    return {"enable_reflect_ftz": False} if has_cuda_option("enable_reflect_ftz") else {}


# CUDA's tanhf (libdevice's __nv_tanhf, non-FTZ, as Triton links it): its constants, as fp32
TANH_SMALL = tl.constexpr(0.6000000238418579)  # below: an odd polynomial in x
TANH_P0 = tl.constexpr(0.01573968306183815)  # p(x2) = ((P0 x2 + P1) x2 + P2) x2 + P3
TANH_P1 = tl.constexpr(-0.05230396240949631)
TANH_P2 = tl.constexpr(0.13315297663211823)
TANH_P3 = tl.constexpr(-0.33332768082618713)
TANH_2_LOG2E = tl.constexpr(2.885390043258667)  # 2 / ln 2
TANH_ONE = tl.constexpr(9.010913848876953)  # at and above: +-1


@triton.jit
def tanhf(x, INTERPRET: tl.constexpr):
    """CUDA's ``tanhf``: libdevice's ``__nv_tanhf`` step for step, both of its branches
    computed and one selected (libdevice branches per element: in a warp of mixed magnitudes,
    both sides run anyway, with the branching on top). Below 0.6 (and for NaN):
    ``fma(x2 * p(x2), x, x)``; above: ``1 - 2 / (2^(2|x|/ln2) + 1)`` with ``ex2``/``rcp`` of
    the approximate, flushing kind, signed as x; +-1 from 9.0109 up. Denormal inputs come
    back unchanged, as CUDA's do (``x * x`` is 0 there)."""
    if INTERPRET:
        return 2.0 * tl.sigmoid(2.0 * x) - 1.0
    else:
        a = tl.abs(x)
        x2 = x * x
        p = tl.fma(tl.fma(tl.fma(x2, TANH_P0, TANH_P1), x2, TANH_P2), x2, TANH_P3)
        small = tl.fma(tl.fma(p, x2, 0.0), x, x)
        e = _approx(a * TANH_2_LOG2E, "ex2.approx.ftz.f32")
        big = tl.fma(_approx(e + 1.0, "rcp.approx.ftz.f32"), -2.0, 1.0)
        big = tl.where(a >= TANH_ONE, 1.0, big)
        sign = x.to(tl.uint32, bitcast=True) & 0x80000000
        big = (big.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        return tl.where(a >= TANH_SMALL, big, small)


SQRT1_2 = tl.constexpr(0.7071067811865476)  # M_SQRT1_2, rounded to fp32 in the kernel


@triton.jit
def gelu_erf(x, INTERPRET: tl.constexpr):
    """ATen's CUDA GELU (``approximate="none"``): ``x * 0.5 * (1 + erff(x * M_SQRT1_2))``."""
    if INTERPRET:
        e = tl.math.erf(x * SQRT1_2)
    else:
        e = libdevice.erf(x * SQRT1_2)
    return (x * 0.5) * (1.0 + e)
