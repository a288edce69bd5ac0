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
    "layer_norm(x, [D], weight, bias, eps) * (scale + 1) + shift, each eager rounding kept",
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
