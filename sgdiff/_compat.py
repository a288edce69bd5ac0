"""The private torch APIs sgdiff relies on, in one place.

They drift between torch releases (the GPU box runs 2.11, CI 2.13): keep every use here. The
modules behind them load on first use, so a kernel that asks for the current CUDA stream does
not import dynamo.
"""
from __future__ import annotations

import contextlib

from typing import Any, Callable, Iterable, Optional, Tuple

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
if TORCH_VERSION < (2, 6):
    raise ImportError(f"sgdiff needs torch >= 2.6, found {torch.__version__}")


# --- capture ------------------------------------------------------------------------------

def aot_capture(compiler: Callable, bw_compiler: Optional[Callable] = None) -> Callable:
    """A dynamo backend that captures the functionalized ATen graph with **no decompositions**
    (so the graph's eager execution is bitwise equal to the model's, kernel for kernel) and
    hands it to ``compiler(gm, example_inputs)``, which returns a boxed callable."""
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=compiler,
        inference_compiler=compiler,
        bw_compiler=bw_compiler or boxed_eager,
        decompositions={},
        keep_inference_input_mutations=True,
    )

    def capture(gm: torch.fx.GraphModule, example_inputs):
        with eager_interpolation():
            return backend(gm, example_inputs)

    return capture


@contextlib.contextmanager
def eager_interpolation():
    """Within the block, ATen's interpolation ops trace as the kernels eager runs.

    torch registers Python decompositions for ``upsample_*`` at the CompositeImplicitAutograd
    and Autograd keys (``torch._decomp.decompositions``); a trace takes them whatever the
    decomposition table says, so ``F.interpolate(x, scale_factor=2)`` is captured as an index
    computation and ``aten._unsafe_index`` (the same bits, but an index kernel and copies: a
    Flux VAE decode at 1024² ran 119 ms against eager's 85 on an H200). Without them, the trace
    records what eager's C++ composite calls: ``aten.upsample_nearest2d.default``, eager's kernel.
    """
    from torch._C import DispatchKey

    keys = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
    removed = []
    for op in _interpolation_overloads():
        for key in keys:
            fn = op.py_kernels.get(key)
            if fn is not None and getattr(fn, "__module__", "").startswith("torch._decomp"):
                removed.append((op, key, op.py_kernels.pop(key)))
                op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, fn in removed:
            op.py_kernels[key] = fn
            op._dispatch_cache.clear()


_INTERPOLATION: list = []


def _interpolation_overloads() -> list:
    """Every overload of ATen's ``upsample_*`` ops (nearest, nearest-exact, linear, bilinear,
    bicubic, trilinear, anti-aliased)."""
    if not _INTERPOLATION:
        for name in dir(torch.ops.aten):
            if "upsample" in name:
                packet = getattr(torch.ops.aten, name)
                _INTERPOLATION.extend(getattr(packet, o) for o in packet.overloads())
    return _INTERPOLATION


def fold_tensor_str_comparisons() -> bool:
    """Let dynamo trace ``tensor == "text"`` and ``tensor != "text"`` as Python computes them.

    Python gives False and True (``Tensor.__eq__`` returns NotImplemented, so does ``str``'s, and
    the comparison falls back to identity). Dynamo before torch 2.13 puts the ``__eq__`` call in
    the graph, gets NotImplemented back and breaks the graph: a module that keeps a sentinel
    string among cached tensors (a causal video VAE's ``feat_cache[i] == "Rep"``) breaks inside
    its frame loop, and its blocks then compile one by one until the recompile limit leaves the
    rest eager. Newer dynamo models CPython's comparison protocol and needs nothing. Returns
    whether the tracer is patched (idempotent)."""
    try:
        from torch._dynamo.variables.constant import ConstantVariable
        from torch._dynamo.variables.tensor import TensorVariable
    except ImportError:
        return False
    if hasattr(TensorVariable, "richcompare_impl"):  # dynamo with CPython's comparison protocol
        return False
    original = TensorVariable.call_method
    if getattr(original, "folds_str_comparisons", False):
        return True

    def call_method(self, tx, name, args, kwargs):
        if (name in ("__eq__", "__ne__") and len(args) == 1 and not kwargs
                and isinstance(args[0], ConstantVariable) and isinstance(args[0].value, (str, bytes))):
            return ConstantVariable.create(name == "__ne__")
        return original(self, tx, name, args, kwargs)

    call_method.folds_str_comparisons = True
    TensorVariable.call_method = call_method
    return True


def boxed_eager(gm: torch.fx.GraphModule, example_inputs) -> Callable:
    return boxed(gm.forward)


def static_input_positions() -> Optional[Tuple[int, ...]]:
    """Within an aot_autograd compiler call: the positions of the graph's inputs that are the
    model's weights and buffers (aot_autograd's static inputs), else None."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    positions = getattr(meta, "static_input_indices", None)
    return None if positions is None else tuple(int(i) for i in positions)


def boxed(fn: Callable) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


def explain_recompiles():
    """A context in which torch.compile's recompile limits do not stop a compile: each explain
    compiles with a backend of its own, so explaining one model again and again adds cache
    entries beside those of the user's compiled models (which are never evicted)."""
    import torch._dynamo.config as config

    names = [n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit") if hasattr(config, n)]
    return config.patch({n: 1 << 20 for n in names})


@contextlib.contextmanager
def graph_breaks(found: list):
    """Append to ``found`` the reasons of the graph breaks torch.compile records inside the
    block (dynamo's ``counters["graph_break"]``, one message per kind of break)."""
    from torch._dynamo.utils import counters

    before = dict(counters["graph_break"])
    try:
        yield found
    finally:
        found.extend(reason for reason, n in counters["graph_break"].items() if n > before.get(reason, 0))


def graphs_compiled() -> int:
    """How many distinct graphs torch.compile has compiled in this process (dynamo's
    ``counters["stats"]["unique_graphs"]``): a recompile adds one."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def uncompiled(model):
    """The module a ``torch.compile``'d module wraps (``OptimizedModule._orig_mod``), else ``model``."""
    return getattr(model, "_orig_mod", model)


# --- fake tensors and op schemas ------------------------------------------------------------

def fake_mode_of(tensors: Iterable[torch.Tensor]):
    """The FakeTensorMode the tensors share, None if none or if they disagree."""
    from torch._guards import detect_fake_mode

    try:
        return detect_fake_mode(list(tensors))
    except AssertionError:
        return None


def real_tensors():
    """A context in which ops run on real tensors, even within a compile's fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def new_fake_mode():
    """A FakeTensorMode of its own (for graphs whose values have none in common)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def is_op_overload(target: Any) -> bool:
    """Whether ``target`` is an ATen-style ``OpOverload`` (``torch.ops.aten.add.Tensor``)."""
    return isinstance(target, torch._ops.OpOverload)


def op_schema(target: Any):
    """The ``FunctionSchema`` of an op overload, None for anything else."""
    return getattr(target, "_schema", None)


# --- CUDA -----------------------------------------------------------------------------------

def current_cuda_device() -> int:
    """The current CUDA device's index, without ``torch.cuda``'s Python layers."""
    return torch._C._cuda_getDevice()


def current_raw_stream(device: int) -> int:
    """The current CUDA stream of ``device`` as a raw handle (what a kernel launch takes)."""
    return torch._C._cuda_getCurrentRawStream(device)


def cudnn_enabled() -> bool:
    """``torch.backends.cudnn.enabled``, read without its Python property."""
    return torch._C._get_cudnn_enabled()


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale) -> Optional[str]:
    """The fused kernel ``F.scaled_dot_product_attention`` picks for these operands (no mask, no
    dropout): ``"flash"``, ``"efficient"``, ``"cudnn"``, or None (the math path, or a selector this
    torch does not expose)."""
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale))
    except Exception:  # a torch without the selector, or operands it refuses
        return None
    return {1: "flash", 2: "efficient", 3: "cudnn"}.get(choice)


def convolution_on_cudnn(x, weight, bias, stride, padding, dilation, groups) -> bool:
    """Whether ATen runs this (non-transposed) convolution on cuDNN."""
    backend = torch._C._select_conv_backend(x, weight, bias, list(stride), list(padding), list(dilation), False,
                                            [0] * (x.dim() - 2), groups)
    return backend == torch._C._ConvBackend.Cudnn


@contextlib.contextmanager
def cuda_graph_capture(graph: "torch.cuda.CUDAGraph", **kwargs):
    """``torch.cuda.graph(graph, **kwargs)`` that leaves the CUDA generators usable when the
    capture fails.

    A capture that fails (a host synchronization in the captured code, an error raised inside
    it) never reaches the generators' capture epilogue: the default CUDA generator stays marked
    as capturing, and every later random draw on that device raises "Offset increment outside
    graph capture encountered unexpectedly" -- in the user's code, long after the capture. On
    failure the capturing device's default generator gets a fresh copy of its state (the same
    seed and offset, so the random stream goes on where it was) and the error propagates. (Other
    devices' generators are left alone: a capture registers only its own device's.)"""
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    except BaseException:  # still on the capture's device: torch.cuda.graph captures on the current one
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        generator.graphsafe_set_state(generator.clone_state())
        raise


_ADDRESSES_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds


def addresses_equal(tensors: list, addresses: list, positions: list) -> bool:
    """Whether ``tensors[i].data_ptr() == addresses[i]`` at every ``i`` of ``positions`` (the check
    of a CUDA graph's fixed inputs before each replay): one C++ call where torch has it (CUDA
    builds; the check Inductor's CUDA graphs make), else a Python loop (~40 µs for 400 weights)."""
    if _ADDRESSES_EQUAL is not None:
        return _ADDRESSES_EQUAL(tensors, addresses, positions)
    return all(tensors[i].data_ptr() == addresses[i] for i in positions)


def copy_all(destinations: list, sources: list) -> None:
    """``d.copy_(s)`` for each pair, as one foreach op (fewer launches from the host)."""
    if destinations:
        torch._foreach_copy_(destinations, sources)


# --- kernels ATen keeps private -------------------------------------------------------------

def addmm_gelu_tanh(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(bias + mat1 @ mat2)``: cuBLASLt's GELU_BIAS epilogue on CUDA where it applies,
    else ``addmm`` then ``gelu_(approximate="tanh")`` (ATen's ``_addmm_activation``)."""
    return torch._addmm_activation(bias, mat1, mat2, use_gelu=True)


def version(t: torch.Tensor) -> int:
    """``t``'s version counter (bumped by every in-place update); 0 for an inference tensor,
    which has none (nor may it be updated outside inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return 0


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: Optional[torch.Tensor], out_dtype: torch.dtype, fast_accumulation: bool = False) -> torch.Tensor:
    """``(a @ b) * scale_a * scale_b + bias`` of FP8 ``a`` (row-major) and ``b`` (column-major),
    accumulated in fp32 (with ``fast_accumulation``, in the tensor cores' own accumulator) and
    rounded once to ``out_dtype``; ``[M, 1]`` and ``[1, N]`` scales scale rows and columns
    (``torch._scaled_mm``: cuBLASLt, or CUTLASS's row-wise kernel)."""
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype,
                            use_fast_accum=fast_accumulation)


def hold_stream(cycles: int) -> None:
    """Keep the current CUDA stream busy for ``cycles`` GPU clock cycles (``torch.cuda._sleep``),
    so that kernels the host enqueues meanwhile start back to back when it ends; nothing where
    this torch lacks it."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(cycles))


@contextlib.contextmanager
def cuda_allocation_history(max_entries: int = 400_000):
    """Within the block, the caching allocator records every allocation and free with its Python
    frames; yields a callable returning the trace of device 0 so far (torch's snapshot events:
    ``action``, ``addr``, ``size``, ``frames``)."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield lambda: torch.cuda.memory._snapshot()["device_traces"][0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
