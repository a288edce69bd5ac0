"""Runtime choice of an op's implementation, with first-sight verification.

The custom op's device kernel calls :func:`run`. It walks the op's KernelSpecs in priority
order and takes the first that supports the input's device and dtype and whose implementation
``supports`` the inputs; the reference implementation (the eager chain) supports everything and
comes last, so an input no kernel handles falls back to eager numerics instead of failing.

A bit-exact kernel is trusted per input *signature* (shapes, strides, dtypes, device and
capability, pointer alignment, scalar arguments) only after it has once produced the
reference's exact bits on that signature, checked outside CUDA-graph capture. A mismatch
disables that implementation of that op (not others) for the process, with one warning; a
kernel that raises is disabled the same way. During capture an unverified signature runs the
reference.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from sgdiff.kernels import registry, tuning
from sgdiff.tiers import Contract

log = logging.getLogger("sgdiff")

_disabled: Dict[Tuple[str, str], str] = {}  # (op, backend) -> reason
_verified: Set[tuple] = set()  # (op, backend, signature)
_epoch = [0]  # bumped whenever settled choices are forgotten: call sites forget theirs too
_verify = contextvars.ContextVar("sgdiff_verify", default=True)


def disable(op: str, backend: str, reason: str) -> None:
    """Stop using one implementation of one op for the rest of the process."""
    if (op, backend) not in _disabled:
        _disabled[(op, backend)] = reason
        _plans.clear()
        _chosen.clear()
        _epoch[0] += 1
        log.warning("sgdiff: %s implementation of %s disabled, falling back: %s", backend, op, reason)


_input_caches: List[Any] = []  # objects with refresh(): derived copies of inputs an implementation keeps


def keep_input_copies(cache: Any) -> Any:
    """Register a cache of copies derived from op inputs (an object with ``refresh() -> int``,
    which remakes every copy from its input as it is now), for :func:`refresh_input_copies`."""
    if cache not in _input_caches:
        _input_caches.append(cache)
    return cache


def refresh_input_copies() -> int:
    """Remake every kept copy (a weight's FP8 copy) from its input; returns how many."""
    return sum(cache.refresh() for cache in _input_caches)


_call_memos: List[Any] = []  # objects with forget(): what an implementation remembers within one graph call


def remember_within_a_call(memo: Any) -> Any:
    """Register a memo (an object with ``forget()``) that holds only within one call of a compiled
    graph (the rows of an activation quantized for the next projection of it), for
    :func:`new_graph_call`."""
    if memo not in _call_memos:
        _call_memos.append(memo)
    return memo


def new_graph_call() -> None:
    """A compiled graph starts a call: what its ops remembered from the last one is forgotten."""
    for memo in _call_memos:
        memo.forget()


def disabled() -> Dict[Tuple[str, str], str]:
    return dict(_disabled)


def reset() -> None:
    """Forget verifications and disabled implementations (for tests)."""
    _disabled.clear()
    _verified.clear()
    _plans.clear()
    _chosen.clear()
    _tuned.clear()
    _epoch[0] += 1


@contextlib.contextmanager
def verification(enabled: bool):
    """First-sight verification on or off for ops run inside the block."""
    token = _verify.set(enabled)
    try:
        yield
    finally:
        _verify.reset(token)


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _load(spec: registry.KernelSpec) -> registry.Impl:
    return spec.load()


def _reference(op: str) -> Callable:
    for spec in registry.kernel_specs(op):
        if spec.backend == "reference":
            return _load(spec).run
    raise RuntimeError(f"sgdiff::{op} has no reference implementation")


def signature(args: Tuple[Any, ...]) -> tuple:
    """What decides a kernel's exact bits: layout, dtype, device, alignment, scalars. (A device
    index stands for its capability: these keys never leave the process.)"""
    return tuple([tuple(map(_argument_signature, a)) if isinstance(a, list) else _argument_signature(a) for a in args])


def _argument_signature(a: Any):
    if isinstance(a, torch.Tensor):
        return a.shape, a.stride(), a.dtype, a.get_device(), a.data_ptr() & 15
    return a


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    """None if bitwise equal (NaN equal to NaN), else a description of the first difference."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    differ = got.contiguous().view(bits) != want.contiguous().view(bits)
    if got.is_floating_point():
        differ &= ~(torch.isnan(got) & torch.isnan(want))
    if not bool(differ.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(differ)[0])
    return (f"{int(differ.sum())} elements differ, first at {idx}: kernel {got[idx].item()!r}, "
            f"reference {want[idx].item()!r}")


def define_op(op_def: registry.OpDef):
    """Register ``op_def`` with the registry and as ``sgdiff::<name>`` with torch, with its
    reference's signature (its type hints give the schema). The op runs :func:`run` (the best
    implementation for its inputs); its fake implementation is the reference itself, made of
    ATen ops that fake tensors understand. Returns the torch custom op."""
    registry.register_op(op_def)
    name, reference = op_def.name, op_def.reference
    signature = inspect.signature(reference)

    @functools.wraps(reference)
    def implementation(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return run(name, *bound.args)

    implementation.__name__ = implementation.__qualname__ = name
    op = torch.library.custom_op(op_def.qualname, mutates_args=())(implementation)
    op.register_fake(reference)
    return op


@functools.lru_cache(maxsize=None)
def runner(op: str) -> Callable:
    """A plain function running ``op`` (what the op's device kernel does, minus the dispatcher)."""

    def run_op(*args):
        return run(op, *args)

    run_op.__name__ = run_op.__qualname__ = "sgdiff_" + op.replace("::", "_")
    return run_op


def tensor_positions(args) -> Tuple[Tuple[int, Optional[int]], ...]:
    """Where a call's tensors are, as :class:`CallSite` takes them: ``(argument, None)`` for a
    tensor argument, ``(argument, item)`` for a tensor inside a list or tuple argument."""
    found = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            found.append((i, None))
        elif isinstance(a, (list, tuple)):
            found += [(i, j) for j, item in enumerate(a) if isinstance(item, torch.Tensor)]
    return tuple(found)


class CallSite:
    """One call site of a compiled graph: what its calls run.

    With static shapes a site's inputs keep their shapes, strides, dtypes and device from call
    to call (the compiled graph's guards hold them for its inputs, and ATen's rules derive the
    rest), and its non-tensor arguments are the graph's constants: of an input's signature
    only the pointers' alignment can change. So a site settles, per alignment, what a call
    runs: the chosen implementation's launch bound to the signature (``impl.bind(*args)``,
    which does the host arithmetic once), or the implementation itself. Choosing and
    verifying stay :func:`run`'s; a site only remembers what :func:`run` settled, and forgets
    it when an implementation is disabled or the registry changes.
    """

    def __init__(self, op: str, tensors: Tuple[int, ...]):
        self.op = op
        self.tensors = tensors  # positions of the tensor arguments: (argument, None), or (list argument, item)
        self.__name__ = self.__qualname__ = "sgdiff_site_" + op.replace("::", "_")
        self._settled: Dict[tuple, tuple] = {}  # alignment -> (backend, callable)
        self._epoch = None

    def __call__(self, *args):
        if self._epoch != (_epoch[0], registry.generation()):
            self._settled.clear()
            self._epoch = (_epoch[0], registry.generation())
        key = tuple([args[i].data_ptr() & 15 if j is None else args[i][j].data_ptr() & 15 for i, j in self.tensors])
        settled = self._settled.get(key)
        if settled is None:
            return self._settle(key, args)
        backend, fn = settled
        if backend == "reference":
            return fn(*args)
        try:
            return fn(*args)
        except Exception as exc:  # as in run: a kernel must never break the model
            disable(self.op, backend, f"raised {type(exc).__name__}: {exc}")
            return run(self.op, *args)

    def _settle(self, key: tuple, args: tuple):
        out = run(self.op, *args)
        chosen = _chosen.get((self.op, signature(args), registry.generation()))
        if chosen is not None:  # settled by run (not during a capture, nor with verification off)
            spec, fn, impl = chosen
            bind = impl.bind if spec.backend != "reference" else None
            try:
                self._settled[key] = (spec.backend, bind(*args) if bind is not None else fn)
            except Exception as exc:
                disable(self.op, spec.backend, f"could not bind: {type(exc).__name__}: {exc}")
        return out


def _plan(op: str, device: torch.device, dtype: torch.dtype) -> list:
    """The implementations to try for ``op`` on this device and dtype, cached."""
    key = (op, device.type, device.index, dtype, registry.generation())
    plan = _plans.get(key)
    if plan is None:
        cap = _capability(device.index or 0) if device.type == "cuda" else None
        dtype_name = str(dtype).removeprefix("torch.")
        plan = []
        for spec in registry.kernel_specs(op):
            if spec.backend == "reference":
                plan.append((spec, _load(spec)))
                break
            if (op, spec.backend) not in _disabled and spec.supports(device.type, dtype_name, cap):
                try:
                    impl = _load(spec)
                except Exception as exc:  # e.g. no triton on this machine: the next one serves
                    disable(op, spec.backend, f"could not load {spec.loader}: {type(exc).__name__}: {exc}")
                    continue
                plan.append((spec, impl))
        _plans[key] = plan
    return plan


_plans: Dict[tuple, list] = {}


_chosen: Dict[tuple, tuple] = {}  # (op, signature, generation) -> (spec, impl.run, impl), settled choices


def run(op: str, *args):
    """Run ``op`` on ``args`` with the best implementation that accepts them.

    Everything that decides the choice (``supports``, verification) is a function of the
    input's signature, so a settled choice is cached per signature: a call then costs one
    signature and one lookup on top of the kernel launch (the reference's too, once settled).
    """
    sig = signature(args)
    key = (op, sig, registry.generation())
    chosen = _chosen.get(key)
    if chosen is not None:
        spec, fn, _ = chosen
        if spec.backend == "reference":
            return fn(*args)
        try:
            return fn(*args)
        except Exception as exc:  # a kernel must never break the model: fall back
            disable(op, spec.backend, f"raised {type(exc).__name__}: {exc}")
    x = args[0]
    plan = _plan(op, x.device, x.dtype)
    if registry.op_def(op).tuned and len(plan) > 1:
        return _tune_and_run(op, plan, sig, key, args)
    return _choose_and_run(op, plan, sig, key, args)


def _choose_and_run(op: str, plan: list, sig: tuple, key: tuple, args: tuple):
    x = args[0]
    refused = []
    for spec, impl in plan:
        if spec.backend == "reference":
            if refused:  # a rewritten site that runs its chain: said once per signature
                log.info("sgdiff: %s runs its eager chain on signature %s: the %s implementation does not take "
                         "these inputs", op, sig, " and ".join(refused))
            _chosen[key] = (spec, impl.run, impl)
            return impl.run(*args)
        try:
            if impl.supports is not None and not impl.supports(*args):
                refused.append(spec.backend)
                continue
            if spec.contract is Contract.BITEXACT:
                if not _verify.get():
                    # with verification off, an unverified kernel runs but is not settled:
                    # turning verification back on verifies it
                    return impl.run(*args)
                vkey = (op, spec.backend, sig)
                if vkey not in _verified:
                    if x.is_cuda and torch.cuda.is_current_stream_capturing():
                        # no verification inside a capture: the reference runs, nothing is settled
                        return _reference(op)(*args)
                    out = impl.run(*args)
                    diff = _first_difference(out, _reference(op)(*args))
                    if diff is not None:
                        disable(op, spec.backend, f"not bit-exact on signature {sig}: {diff}")
                        continue
                    _verified.add(vkey)
                    _chosen[key] = (spec, impl.run, impl)
                    return out
            _chosen[key] = (spec, impl.run, impl)  # verified, or a looser contract that has nothing to verify
            return impl.run(*args)
        except Exception as exc:  # a kernel must never break the model: fall back
            disable(op, spec.backend, f"raised {type(exc).__name__}: {exc}")
    raise RuntimeError(f"no implementation of sgdiff::{op} for {x.device.type} {x.dtype}")


def _tune_and_run(op: str, plan: list, sig: tuple, key: tuple, args: tuple):
    """A tuned op's first sight of a signature: every implementation's every variant that
    supports it is checked against the reference's bits and timed with it; the fastest is
    settled. One that differs or raises drops out for this signature only (one log line);
    the reference's output is returned (it is the op's bits)."""
    x = args[0]
    spec_ref, ref = plan[-1]
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if not _verify.get() or capturing:  # nothing is settled: the reference, or with verification
        if capturing:  # off the first implementation that takes the inputs, unverified
            return ref.run(*args)
        for spec, impl in plan[:-1]:
            if impl.supports is None or impl.supports(*args):
                return impl.run(*args)
        return ref.run(*args)
    want = ref.run(*args)
    candidates = [(spec_ref, "", ref.run)]
    for spec, impl in plan[:-1]:
        try:
            if impl.supports is not None and not impl.supports(*args):
                continue
            variants = impl.variants(*args) if impl.variants is not None else [("", impl.run)]
        except Exception as exc:
            disable(op, spec.backend, f"raised {type(exc).__name__}: {exc}")
            continue
        for label, fn in variants:
            try:
                diff = _first_difference(fn(*args), want)
            except Exception as exc:
                diff = f"raised {type(exc).__name__}: {str(exc)[:200]}"
            if diff is None:
                candidates.append((spec, label, fn))
            else:
                log.info("sgdiff: %s %s %s left out on signature %s: %s", op, spec.backend, label, sig, diff)
    best, times = 0, [float("nan")] * len(candidates)
    if len(candidates) > 1:
        try:
            best, times = tuning.fastest([fn for _, _, fn in candidates], args)
        except Exception as exc:  # timing must never break the model: the reference stays
            log.warning("sgdiff: timing %s's candidates failed (%s: %s); the reference stays for signature %s",
                        op, type(exc).__name__, exc, sig)
    spec, label, fn = candidates[best]
    log.info("sgdiff: %s on %s: %s %s (%.1f us; %s)", op, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
             spec.backend, label, times[best] * 1e6,
             ", ".join(f"{s.backend} {lb} {t * 1e6:.1f}" for (s, lb, _), t in zip(candidates, times)))
    _chosen[key] = (spec, fn, registry.Impl(run=fn))
    _tuned[key] = (f"{spec.backend} {label}".strip(), [(s.backend, lb, t) for (s, lb, _), t in zip(candidates, times)])
    return want


_tuned: Dict[tuple, tuple] = {}  # (op, signature, generation) -> (chosen, [(backend, variant, seconds)])


def settled(op: str, *args) -> Optional[Callable]:
    """What a call of ``op`` on inputs of this signature runs once :func:`run` has settled it (a
    tuned op: the fastest verified implementation or variant); None before."""
    chosen = _chosen.get((op, signature(args), registry.generation()))
    return chosen[1] if chosen is not None else None


def tuned_choices() -> Dict[Tuple[str, tuple], tuple]:
    """What first sight chose and timed per tuned op and signature: ``{(op, signature): (chosen,
    [(backend, variant, seconds), ...])}``."""
    return {(op, sig): v for (op, sig, gen), v in _tuned.items() if gen == registry.generation()}


def first_sight_report(exclude=frozenset()) -> list:
    """:func:`tuned_choices` as a report reads it, but for the keys in ``exclude`` (those taken
    before a run, say): ``[(op, input shapes, chosen, {candidate: µs})]``, a candidate named
    ``backend variant`` (``reference``: the eager chain itself)."""
    found = []
    for key, (chosen, times) in tuned_choices().items():
        if key not in exclude:
            op, sig = key
            shapes = tuple(tuple(a[0]) for a in sig if isinstance(a, tuple) and a and isinstance(a[0], torch.Size))
            found.append((op, shapes, chosen, {f"{b} {v}".strip(): t * 1e6 for b, v, t in times}))
    return found


def accelerated(op: str, device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``op`` has an implementation other than the reference for this device and dtype."""
    dtype_name = str(dtype).removeprefix("torch.")
    return any(s.backend != "reference" and (op, s.backend) not in _disabled
               and s.supports(device_type, dtype_name, _capability(0) if device_type == "cuda" else None)
               for s in registry.kernel_specs(op))


def reference(op: str) -> Callable:
    """The op's reference implementation: the eager chain itself."""
    return _reference(op)
