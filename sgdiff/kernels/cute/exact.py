"""Eager's arithmetic, instruction by instruction, for CuTe DSL epilogues.

Each helper is inline PTX, so that the DSL's compiler cannot contract a multiply and an add into
an FMA (it does, with no option against it) or pick an approximation: the epilogue computes what
ATen's kernels compute, rounding for rounding. :func:`gelu_tanh_aten` is ATen's CUDA GELU-tanh
of an fp32 value as nvcc compiles it, the sequence of :func:`sgdiff.kernels.triton.gelu_tanh_cat.gelu_tanh`
and :func:`sgdiff.kernels.triton.cuda_math.tanhf` (libdevice's ``__nv_tanhf``), which the GPU
tests check on every fp16 and bf16 value; its constants are theirs as fp32 bit patterns.
"""
from cutlass.cutlass_dsl import dsl_user_op

from sgdiff.kernels.cute.cute_compat import inline_ptx_f32


@dsl_user_op
def add_rn(a, b, *, loc=None, ip=None):
    """a + b, rounded to fp32 (a bias added to a GEMM's sum, as cuBLAS's epilogue adds it)."""
    return inline_ptx_f32("add.rn.f32 $0, $1, $2;", "=f,f,f", (a, b), loc=loc, ip=ip)


@dsl_user_op
def mul_rn(a, b, *, loc=None, ip=None):
    """a * b, rounded to fp32 (never contracted into a later add)."""
    return inline_ptx_f32("mul.rn.f32 $0, $1, $2;", "=f,f,f", (a, b), loc=loc, ip=ip)


@dsl_user_op
def round_bf16(a, *, loc=None, ip=None):
    """fp32 -> bf16 (nearest even) -> fp32."""
    return inline_ptx_f32("{ .reg .b16 h; cvt.rn.bf16.f32 h, $1; cvt.f32.bf16 $0, h; }", "=f,f", (a,), loc=loc, ip=ip)


@dsl_user_op
def round_f16(a, *, loc=None, ip=None):
    """fp32 -> fp16 (nearest even) -> fp32."""
    return inline_ptx_f32("{ .reg .b16 h; cvt.rn.f16.f32 h, $1; cvt.f32.f16 $0, h; }", "=f,f", (a,), loc=loc, ip=ip)


GELU_TANH_PTX = """{
.reg .f32 x3, s, in, a, x2, p, sm, e, big, t, hx, one_t;
.reg .pred ge1, gesmall;
mul.rn.f32 x3, $1, $1;
mul.rn.f32 x3, x3, $1;
fma.rn.f32 s, 0f3D372713, x3, $1;
mul.rn.f32 in, 0f3F4C422A, s;
abs.f32 a, in;
mul.rn.f32 x2, in, in;
fma.rn.f32 p, x2, 0f3C80F082, 0fBD563CAE;
fma.rn.f32 p, p, x2, 0f3E085941;
fma.rn.f32 p, p, x2, 0fBEAAA9ED;
fma.rn.f32 sm, p, x2, 0f00000000;
fma.rn.f32 sm, sm, in, in;
mul.rn.f32 e, a, 0f4038AA3B;
ex2.approx.ftz.f32 e, e;
add.rn.f32 e, e, 0f3F800000;
rcp.approx.ftz.f32 e, e;
fma.rn.f32 big, e, 0fC0000000, 0f3F800000;
setp.ge.f32 ge1, a, 0f41102CB4;
selp.f32 big, 0f3F800000, big, ge1;
copysign.f32 big, in, big;
setp.ge.f32 gesmall, a, 0f3F19999A;
selp.f32 t, big, sm, gesmall;
mul.rn.f32 hx, 0f3F000000, $1;
add.rn.f32 one_t, 0f3F800000, t;
mul.rn.f32 $0, hx, one_t;
}"""


@dsl_user_op
def gelu_tanh_aten(y, *, loc=None, ip=None):
    """ATen's GELU-tanh of ``y`` in fp32 (the module doc), before its rounding to the output dtype."""
    return inline_ptx_f32(GELU_TANH_PTX, "=f,f", (y,), loc=loc, ip=ip)
