"""Which implementations exist for each sgdiff op, and what each promises.

The registry is plain data: importing it imports neither triton nor any op or kernel module.
An implementation is loaded (``importlib``) the first time it is asked for.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from sgdiff.tiers import Contract

log = logging.getLogger("sgdiff")


@dataclasses.dataclass(frozen=True)
class OpDef:
    """An sgdiff op: its name in the ``sgdiff`` namespace and the contract it promises.

    Implementations of an op compute the same function: each spec's contract is the op's or
    stricter. Numerics that differ more are another op.
    """

    name: str  # "layernorm_modulate" (namespace sgdiff) or "mylib::my_op"
    contract: Contract
    module: str  # the module that defines the op (schema, reference, fake impl)
    doc: str = ""

    def load(self):
        """Import the op's module (registers the op with torch); return its default overload."""
        importlib.import_module(self.module)
        import torch

        namespace, _, short = self.name.rpartition("::")
        return getattr(getattr(torch.ops, namespace or "sgdiff"), short).default


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One implementation of one op."""

    op: str
    backend: str  # "reference" | "triton" | ...
    contract: Contract
    loader: str  # "package.module:attribute", imported on first use
    devices: FrozenSet[str] = frozenset({"cpu", "cuda"})
    dtypes: FrozenSet[str] = frozenset({"float32", "float16", "bfloat16"})
    min_capability: Optional[Tuple[int, int]] = None  # CUDA compute capability
    priority: int = 0  # higher is tried first

    def supports(self, device_type: str, dtype_name: str, capability=None) -> bool:
        if device_type not in self.devices or dtype_name not in self.dtypes:
            return False
        if self.min_capability is not None and device_type == "cuda":
            return capability is not None and tuple(capability) >= self.min_capability
        return True

    def load(self) -> Callable:
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module), attr)


_OPS: Dict[str, OpDef] = {}
_SPECS: Dict[str, List[KernelSpec]] = {}
_generation = [0]  # bumped on every registration, so cached choices are redone


def generation() -> int:
    return _generation[0]


def register_op(op: OpDef) -> OpDef:
    if op.name in _OPS and _OPS[op.name] != op:
        raise ValueError(f"sgdiff op {op.name!r} is already registered differently")
    _OPS[op.name] = op
    _SPECS.setdefault(op.name, [])
    return op


def register_kernel(spec: KernelSpec) -> KernelSpec:
    op = _OPS.get(spec.op)
    if op is None:
        raise ValueError(f"KernelSpec for unknown op {spec.op!r}; register the OpDef first")
    if Contract(spec.contract).strictness > op.contract.strictness:
        raise ValueError(
            f"{spec.backend} implementation of {spec.op} promises {spec.contract.value}, "
            f"looser than the op's {op.contract.value}"
        )
    specs = _SPECS[spec.op]
    if spec not in specs:
        specs.append(spec)
        specs.sort(key=lambda s: -s.priority)
        _generation[0] += 1
    return spec


def op_def(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no sgdiff op {name!r}; known: {sorted(_OPS)}") from None


def ops() -> List[OpDef]:
    return list(_OPS.values())


def kernel_specs(op: str) -> List[KernelSpec]:
    """The implementations of ``op``, highest priority first."""
    return list(_SPECS.get(op, ()))


# ---------------------------------------------------------------------------------------
# The built-in ops and their implementations.

register_op(OpDef(
    "layernorm_modulate", Contract.BITEXACT, "sgdiff.kernels.layernorm_modulate",
    "layer_norm(x.to(x_dtype), [D], weight, bias, eps) * (scale + 1) + shift, each eager rounding kept, "
    "cast to out_dtype",
))
register_kernel(KernelSpec(
    "layernorm_modulate", "reference", Contract.BITEXACT,
    "sgdiff.kernels.layernorm_modulate:layernorm_modulate_reference",
))
register_kernel(KernelSpec(
    "layernorm_modulate", "triton", Contract.BITEXACT,
    "sgdiff.kernels.triton.layernorm_modulate:layernorm_modulate",
    devices=frozenset({"cuda"}), min_capability=(8, 0), priority=10,
))

# Chain families beyond LayerNorm-modulate. Each op's module holds its schema, its reference
# implementation (the eager chain, or for a `close` op the fp32 math it promises) and its fake.
for _name, _contract, _doc in (
    ("modulate", Contract.BITEXACT,
     "x * (1 + scale) + shift, no norm; shift optional"),
    ("rmsnorm_modulate", Contract.BITEXACT,
     "rms_norm(x, weight, eps, form) * (1 + scale) + shift, each eager rounding kept"),
    ("residual_gate", Contract.BITEXACT,
     "residual + gate * update (tanh(gate) with tanh_gate), in eager's promoted dtypes and the "
     "residual's layout (contiguous with residual_layout=False); the update maybe + a bias, / a divisor; "
     "the sum maybe cast to out_dtype"),
    ("residual_add", Contract.BITEXACT,
     "update / divisor + residual (or residual + update / divisor), in eager's promoted dtype and layout"),
    ("rope", Contract.BITEXACT,
     "(x.float() * cos + rotate(x).float() * sin).to(x.dtype), interleaved pairs or rotate-half"),
    ("rope_complex", Contract.BITEXACT,
     "view_as_real(view_as_complex(x.float() pairs) * freqs).flatten(3).type_as(x)"),
    ("rope_even_odd", Contract.BITEXACT,
     "out[..., 0::2] = x1 * cos - x2 * sin; out[..., 1::2] = x1 * sin + x2 * cos (Wan)"),
    ("rms_norm", Contract.BITEXACT,
     "RMSNorm over the last dim: F.rms_norm composite or fused, or diffusers' RMSNorm"),
    ("layer_norm", Contract.BITEXACT,
     "native_layer_norm(x.to(x_dtype)) over the last dim, cast to out_dtype"),
    ("silu_mul", Contract.BITEXACT,
     "silu(a) * b"),
    ("rms_norm_rope", Contract.BITEXACT,
     "rope(rms_norm(x, weight, eps, form), cos, sin, interleaved): a QK norm and its RoPE"),
    ("rms_norm_cat_rope", Contract.BITEXACT,
     "rope(cat([rms_norm(x0, w0, eps, form), rms_norm(x1, w1, eps, form)], 1), cos, sin, interleaved)"),
    ("gelu_tanh_cat", Contract.BITEXACT,
     "cat([head, gelu(x, approximate='tanh')], dim=-1)"),
    ("conv_silu", Contract.BITEXACT,
     "silu(convolution(x, weight, bias, stride, padding, dilation, groups))"),
    ("conv_silu_mul", Contract.BITEXACT,
     "a, gate = convolution(x, weight, bias, ...).chunk(2, dim=1); a * silu(gate)"),
    ("cast_copy", Contract.BITEXACT,
     "F.pad((relu(x) if relu else x).to(dtype), pad, value), contiguous or in x's layout"),
    ("linear_attention_out", Contract.BITEXACT,
     "(h[:, :, :-1] / (h[:, :, -1:] + eps)).flatten(1, 2).transpose(1, 2).to(dtype)"),
    ("linear_gelu_tanh", Contract.CLOSE,
     "gelu_tanh(x @ weight.T + bias) in one fp32 pass, one rounding to x.dtype. fp32: bitwise "
     "equal to eager. fp16/bf16 (measured, tests/test_activation.py): a third of the elements "
     "differ from eager's two roundings, by at most 2 ulps where |out| >= 0.1 and at most "
     "2^-10 (fp16) / 2^-7 (bf16) of max |out| anywhere. On CUDA: cuBLASLt's GELU_BIAS epilogue "
     "(tests/gpu/test_linear_gelu_gpu.py checks the same bounds)"),
):
    register_op(OpDef(_name, _contract, f"sgdiff.kernels.{_name}", _doc))
    register_kernel(KernelSpec(_name, "reference", _contract, f"sgdiff.kernels.{_name}:{_name}_reference"))
del _name, _contract, _doc

# The feed-forward GEMM and its GELU as one cuBLASLt call (close: one fp32 pass).
register_kernel(KernelSpec(
    "linear_gelu_tanh", "cublaslt", Contract.CLOSE, "sgdiff.kernels.cublaslt:linear_gelu_tanh",
    devices=frozenset({"cuda"}), dtypes=frozenset({"float16", "bfloat16"}), priority=10,
))

for _name, _module in (("residual_gate", "residual_gate"), ("residual_add", "residual_gate"), ("rope", "rope"),
                      ("rope_even_odd", "rope"),
                      ("rms_norm", "rms_norm"), ("silu_mul", "silu_mul"), ("gelu_tanh_cat", "gelu_tanh_cat"),
                      ("rms_norm_rope", "rms_norm_rope"), ("rms_norm_cat_rope", "rms_norm_rope"),
                      ("rope_complex", "rope"), ("conv_silu", "conv_silu"), ("conv_silu_mul", "conv_silu"),
                      ("cast_copy", "cast_copy"), ("linear_attention_out", "linear_attention_out"),
                      ("modulate", "modulate"), ("rmsnorm_modulate", "rmsnorm_modulate"),
                      ("layer_norm", "layernorm_modulate")):
    register_kernel(KernelSpec(
        _name, "triton", Contract.BITEXACT, f"sgdiff.kernels.triton.{_module}:{_name}",
        devices=frozenset({"cuda"}), min_capability=(8, 0), priority=10,
    ))
del _name, _module
