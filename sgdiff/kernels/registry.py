"""Which ops exist, which implementations each has, and what each promises.

An op is declared where it is defined: its module (``sgdiff.kernels.<op>``) builds an
:class:`OpDef` (name, contract, reference implementation, accelerated implementations, example
inputs) and registers it through :func:`sgdiff.kernels.dispatch.define_op`. Nothing here lists
the built-in ops: the first question about them (:func:`ops`, :func:`op_def`,
:func:`kernel_specs`) imports every module of :mod:`sgdiff.kernels`, and each module's
declaration registers itself. An accelerated implementation is named by where it lives
(:class:`KernelSpec`'s ``loader``) and imported the first time it is asked for, so declaring an
op imports no Triton.

An implementation module declares what it offers as one :class:`Impl` object (its launch,
which inputs it takes, how it binds a launch to a signature).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from sgdiff.tiers import Contract

log = logging.getLogger("sgdiff")


@dataclasses.dataclass(frozen=True)
class Impl:
    """An implementation of an op, as its module declares it.

    ``run(*args)`` takes the op's arguments (positional, in the op's order, defaults applied)
    and returns the op's output. ``supports(*args)`` says whether ``run`` computes these
    inputs (shapes, strides, dtypes, scalars; the device is the spec's business); None: all.
    ``bind(*args)`` returns a callable equivalent to ``run`` for every input of this signature
    (shapes, strides, dtypes, alignment, scalars) with the host arithmetic done once; None:
    ``run`` itself serves. ``variants(*args)`` (ops declared ``tuned``) returns labelled
    callables, each equivalent to ``run`` for this signature (a kernel's tile
    configurations): first sight verifies and times every one and keeps the fastest.
    """

    run: Callable
    supports: Optional[Callable[..., bool]] = None
    bind: Optional[Callable[..., Callable]] = None
    variants: Optional[Callable[..., list]] = None


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One implementation of one op: where it lives, what it promises, where it runs."""

    op: str
    backend: str  # "reference" | "triton" | "cublaslt" | ...
    contract: Optional[Contract]  # None in an OpDef's impls: the op's
    loader: str  # "package.module:attribute" (an Impl or a plain function), imported on first use
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

    def load(self) -> Impl:
        module, _, attr = self.loader.partition(":")
        found = getattr(importlib.import_module(module), attr)
        return found if isinstance(found, Impl) else Impl(run=found)


def cute(module: str, **fields) -> KernelSpec:
    """The CuTe DSL implementation in ``sgdiff.kernels.cute.<module>`` (Hopper's instructions), for
    an OpDef's impls: its ``Impl`` is the module's attribute named after the op in capitals."""
    fields = {"devices": frozenset({"cuda"}), "min_capability": (9, 0), "dtypes": frozenset({"float16", "bfloat16"}),
              "priority": 5, **fields}
    return KernelSpec("", "cute", None, f"sgdiff.kernels.cute.{module}", **fields)


def first_variant_impl(variants: Callable[..., list], supports: Callable[..., bool]) -> Impl:
    """A tuned implementation whose plain ``run`` and ``bind`` take its first variant (first
    sight of a signature verifies and times them all)."""
    def bind(*args):
        return variants(*args)[0][1]

    return Impl(run=lambda *args: bind(*args)(*args), supports=supports, bind=bind, variants=variants)


def triton(module: str, **fields) -> KernelSpec:
    """The Triton implementation in ``sgdiff.kernels.triton.<module>``, for an OpDef's impls:
    its ``Impl`` is the module's attribute named after the op in capitals."""
    fields = {"devices": frozenset({"cuda"}), "min_capability": (8, 0), "priority": 10, **fields}
    return KernelSpec("", "triton", None, f"sgdiff.kernels.triton.{module}", **fields)


@dataclasses.dataclass(frozen=True)
class OpDef:
    """An sgdiff op: its name, the contract it promises, and what computes it.

    ``reference`` is the eager chain itself (the oracle every bit-exact implementation is
    verified against; for a ``close`` op, the fp32 math it promises); its signature and type
    hints are the op's schema. ``impls`` are the accelerated implementations (each spec's
    contract is the op's or stricter: numerics that differ more are another op).
    ``examples`` are the inputs the op meets in models (:class:`sgdiff.kernels.examples.Example`):
    the tests compile, interpret and run them, and the kernel bench times them. An op with no
    reference implements itself (its module registers it with torch); ``module`` then names it.
    A ``tuned`` op's implementations (and each one's variants) compute the same bits, so at
    first sight of a signature every one is verified and timed, the reference too, and the
    fastest is kept; one that differs there only drops out for that signature (a GEMM's bits
    follow the kernel cuBLAS picks for that shape). ``addends`` name the operands the op can
    take as the two tensors eager summed into them (each pair: the operand's parameter and
    the addend's), so that a sum whose every reader is such an operand is never made.
    ``caches_inputs``: the op keeps a derived copy of an input between calls (a weight's FP8
    copy), remade when the input's version changes; a CUDA graph that replays the op checks its
    fixed inputs' versions too (:mod:`sgdiff.fxpasses.cudagraphs`).
    """

    name: str  # "layernorm_modulate" (namespace sgdiff) or "mylib::my_op"
    contract: Contract
    reference: Optional[Callable] = None
    impls: Tuple[KernelSpec, ...] = ()
    examples: tuple = ()
    doc: str = ""
    module: Optional[str] = None
    tuned: bool = False
    addends: Tuple[Tuple[str, str], ...] = ()  # (operand, its addend's parameter): see fxpasses.addends
    caches_inputs: bool = False

    @property
    def qualname(self) -> str:
        return self.name if "::" in self.name else f"sgdiff::{self.name}"

    def load(self):
        """Import the op's module (registers the op with torch); return its default overload."""
        importlib.import_module(self.module or self.reference.__module__)
        import torch

        namespace, _, short = self.qualname.rpartition("::")
        return getattr(getattr(torch.ops, namespace), short).default

    def triton_impl(self) -> Optional[Impl]:
        """The op's Triton implementation, loaded (None if it has none)."""
        spec = next((s for s in kernel_specs(self.name) if s.backend == "triton"), None)
        return spec.load() if spec is not None else None


_OPS: Dict[str, OpDef] = {}
_SPECS: Dict[str, List[KernelSpec]] = {}
_generation = [0]  # bumped on every registration, so cached choices are redone
_discovered = [False]


def generation() -> int:
    """Bumped on every registration. Discovery comes first: a choice keyed on the generation
    before the built-in ops registered themselves would never be found again."""
    if not _discovered[0]:
        _discover()
    return _generation[0]


def _discover() -> None:
    """Import every module of :mod:`sgdiff.kernels` once: each op module registers its op."""
    if _discovered[0]:
        return
    _discovered[0] = True
    import sgdiff.kernels as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")


def register_op(op: OpDef) -> OpDef:
    """Register ``op``, its reference (an implementation that supports everything, tried
    last) and the implementations it declares."""
    if op.name in _OPS:
        if _OPS[op.name] != op:
            raise ValueError(f"sgdiff op {op.name!r} is already registered differently")
        return op
    _OPS[op.name] = op
    _SPECS.setdefault(op.name, [])
    for spec in op.impls:
        loader = spec.loader if ":" in spec.loader else f"{spec.loader}:{op.name.rpartition('::')[2].upper()}"
        register_kernel(dataclasses.replace(spec, op=op.name, contract=spec.contract or op.contract, loader=loader))
    if op.reference is not None:
        register_kernel(KernelSpec(op.name, "reference", op.contract,
                                   f"{op.reference.__module__}:{op.reference.__qualname__}", priority=-(10 ** 9)))
    return op


def register_kernel(spec: KernelSpec) -> KernelSpec:
    """Add an implementation of a registered op (user extensions, tests)."""
    op = _OPS.get(spec.op)
    if op is None:
        _discover()
        op = _OPS.get(spec.op)
    if op is None:
        raise ValueError(f"KernelSpec for unknown op {spec.op!r}; register the OpDef first")
    if spec.contract is None or Contract(spec.contract).strictness > op.contract.strictness:
        raise ValueError(
            f"{spec.backend} implementation of {spec.op} promises "
            f"{spec.contract.value if spec.contract else 'nothing'}, looser than the op's {op.contract.value}"
        )
    specs = _SPECS[spec.op]
    if spec not in specs:
        specs.append(spec)
        specs.sort(key=lambda s: -s.priority)
        _generation[0] += 1
    return spec


def op_def(name: str) -> OpDef:
    _discover()
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no sgdiff op {name!r}; known: {sorted(_OPS)}") from None


def ops() -> List[OpDef]:
    """Every registered op, by name."""
    _discover()
    return [_OPS[name] for name in sorted(_OPS)]


def kernel_specs(op: str) -> List[KernelSpec]:
    """The implementations of ``op``, highest priority first (the reference last)."""
    _discover()
    return list(_SPECS.get(op, ()))
