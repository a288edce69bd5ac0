"""The CuTe DSL's internals sgdiff uses, in one place: inline PTX over fp32 values."""
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T


def inline_ptx_f32(ptx: str, constraints: str, args, loc=None, ip=None) -> Float32:
    """An fp32 result of the PTX ``ptx`` over fp32 ``args`` (``$0`` the result, ``$1``... the
    arguments), free of side effects (the compiler may schedule, share or drop it)."""
    values = [Float32(a).ir_value(loc=loc, ip=ip) for a in args]
    return Float32(llvm.inline_asm(T.f32(), values, ptx, constraints, has_side_effects=False, is_align_stack=False))
