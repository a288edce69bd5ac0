"""sgdiff::attention_fp8 on Hopper: cuDNN's FP8 attention (``sdpa_fp8``) through the cuDNN
frontend's graph API.

1. q, k, v to e4m3 copies in ``[B, S, H, D]`` order (:func:`sgdiff.kernels.triton.fp8_heads.quantize_operands`);
   the scales stay on the device: cuDNN reads them as its ``descale_q`` / ``descale_k`` tensors.
   v's copy is scaled per channel, so cuDNN sees it with a unit scale; P is scaled by 448 before
   its e4m3 rounding (``scale_s``, ``descale_s``) and the output kept at v's copy's scale
   (``scale_o`` = 1: every output lies within its ±448).
2. One cuDNN graph per geometry (batch, heads, tokens, head dim, causal, scale), built on its
   first launch (at the first sight of a signature: outside CUDA-graph capture) and kept; it runs
   on torch's current stream with a workspace from torch's allocator, so a CUDA graph captures it
   like any kernel. Where the token counts are no multiples of :data:`PAD`, a second graph takes
   them padded: the copies padded with zero tokens, which the graph masks out
   (``use_padding_mask`` with the true counts), the same attention over the same keys (cuDNN
   9.19 takes Wan's 32760 tokens as they are, and on an H100 runs them 11% faster padded). At
   the first launch each graph's plans (cuDNN's ranking of its engines and knobs) are timed as
   whole launches on the call's operands and the fastest kept (:func:`chosen_plan`).
3. The e4m3 output restored (:func:`sgdiff.kernels.triton.fp8_heads.restore_heads`), returned as
   a ``[B, H, S, D]`` view of ``[B, S, H, D]`` memory.

Hopper's FP8 attention writes e4m3 only (bf16 output is Blackwell's), hence the output's own
rounding in the op's contract.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Dict, Optional

import torch

from sgdiff import _compat
from sgdiff.kernels import tuning
from sgdiff.kernels.attention_fp8 import P_SCALE, takes_head_dim
from sgdiff.kernels.registry import Impl

log = logging.getLogger("sgdiff")


@functools.lru_cache(maxsize=None)
def frontend():
    """The ``cudnn`` module of ``nvidia-cudnn-frontend`` (ImportError where it is not installed)."""
    import cudnn

    return cudnn


def available() -> bool:
    """Whether the cuDNN frontend imports here."""
    try:
        frontend()
        return True
    except Exception as exc:  # not installed, or its library does not load
        _say_once(f"cuDNN's FP8 attention is not available: {type(exc).__name__}: {exc}")
        return False


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    log.info("sgdiff: %s", message)


def heads_dims(b: int, h: int, s: int, d: int):
    """``(dims, strides)`` of a ``[B, H, S, D]`` view of contiguous ``[B, S, H, D]`` memory."""
    return (b, h, s, d), (s * h * d, d, h * d, 1)


SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
PAD = 128  # the token counts a padded geometry rounds up to
PLANS_TIMED = 8  # the heuristics' first plans a geometry's first launch builds and times


def padded(tokens: int) -> int:
    return -(-tokens // PAD) * PAD


def define_graph(cudnn, b: int, h: int, s_q: int, s_k: int, d: int, is_causal: bool, sm_scale: float, handle=None,
                 pad: bool = False):
    """The cuDNN graph of one geometry, validated (not yet built): ``(graph, tensors)`` with
    ``tensors`` the graph's q, k, v, scalars (:data:`SCALARS`), o, amax_s and amax_o by name; with
    ``pad``, q, k, v and o hold :func:`padded` token counts and the graph masks the padding out
    (``seq_len_q`` and ``seq_len_kv``, int32 ``[B, 1, 1, 1]``, the true counts, in ``tensors``)."""
    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    options = dict(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32)
    graph = cudnn.pygraph(**options, **({"handle": handle} if handle is not None else {}))
    rows_q, rows_k = (padded(s_q), padded(s_k)) if pad else (s_q, s_k)
    tensors = {}
    for name, s in (("q", rows_q), ("k", rows_k), ("v", rows_k)):
        dims, strides = heads_dims(b, h, s, d)
        tensors[name] = graph.tensor(name=name, dim=dims, stride=strides, data_type=e4m3)
    for name in SCALARS:
        tensors[name] = graph.tensor(name=name, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
    masking = {}
    if pad:
        for name in ("seq_len_q", "seq_len_kv"):
            tensors[name] = graph.tensor(name=name, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1),
                                         data_type=cudnn.data_type.INT32)
        masking = dict(use_padding_mask=True, seq_len_q=tensors["seq_len_q"], seq_len_kv=tensors["seq_len_kv"])
    o, _, amax_s, amax_o = graph.sdpa_fp8(
        q=tensors["q"], k=tensors["k"], v=tensors["v"], **{name: tensors[name] for name in SCALARS}, **masking,
        generate_stats=False, attn_scale=sm_scale, use_causal_mask=is_causal, name="attention_fp8")
    dims, strides = heads_dims(b, h, rows_q, d)
    o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
    tensors.update(o=o, amax_s=amax_s, amax_o=amax_o)
    graph.validate()
    return graph, tensors


class _Plan:
    """One geometry's built graph, as it is or padded (``pad``; raises where cuDNN refuses it),
    its handle and its fixed inputs, on one device."""

    def __init__(self, device: torch.device, b, h, s_q, s_k, d, is_causal, sm_scale, pad: bool):
        cudnn = frontend()
        self.handle, self.pad = _handle(device), pad
        self.graph, self.tensors = define_graph(cudnn, b, h, s_q, s_k, d, is_causal, sm_scale, self.handle, pad)
        self.graph.build_operation_graph()
        self.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.graph.check_support()
        self.graph.build_plans()  # the heuristics' first plan that builds, until select
        self.rows = (padded(s_q), padded(s_k)) if pad else (s_q, s_k)
        self.workspace_bytes = max(int(self.graph.get_workspace_size()), 1)
        one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=device)
        self.fixed = {"descale_v": one, "descale_s": one / P_SCALE, "scale_s": one * P_SCALE, "scale_o": one}
        if pad:
            self.fixed.update(seq_len_q=torch.full((b, 1, 1, 1), s_q, dtype=torch.int32, device=device),
                              seq_len_kv=torch.full((b, 1, 1, 1), s_k, dtype=torch.int32, device=device))

    def plans(self, device: torch.device):
        """``[(index, workspace)]``: the first :data:`PLANS_TIMED` plans cuDNN's heuristics rank
        (engines and their knobs: the same math, other tilings) that build here."""
        built = []
        for index in range(min(self.graph.get_execution_plan_count(), PLANS_TIMED)):
            try:
                self.graph.build_plan_at_index(index)
                built.append((index, torch.empty(max(int(self.graph.get_workspace_size_plan_at_index(index)), 1),
                                                 dtype=torch.uint8, device=device)))
            except Exception:  # a plan the heuristics rank that does not build here
                continue
        return built

    def select(self, index: int) -> None:
        """Plan ``index`` for every later :meth:`run`."""
        self.graph.build_plan_at_index(index)
        self.workspace_bytes = max(int(self.graph.get_workspace_size_plan_at_index(index)), 1)

    def run(self, q8, k8, v8, q_scale, k_scale, o8, plan=None):
        """The selected plan, or ``plan`` (``(index, workspace)``), on torch's current stream (a
        capture's, where one is under way)."""
        cudnn, t = frontend(), self.tensors
        amax = torch.empty((2, 1, 1, 1), dtype=torch.float32, device=q8.device)
        pack = {t["q"]: q8, t["k"]: k8, t["v"]: v8, t["o"]: o8, t["amax_s"]: amax[0:1], t["amax_o"]: amax[1:2],
                t["descale_q"]: q_scale.reshape(1, 1, 1, 1), t["descale_k"]: k_scale.reshape(1, 1, 1, 1),
                **{t[name]: value for name, value in self.fixed.items()}}
        cudnn.set_stream(handle=self.handle, stream=_stream(q8.device))
        if plan is not None:
            self.graph.execute_plan_at_index(pack, plan[1], plan[0], self.handle)
            return
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=q8.device)
        self.graph.execute(pack, workspace, handle=self.handle)


def attend(plan: _Plan, q, k, v, choice=None):
    """The op's launch through ``plan`` (its selected cuDNN plan, or ``choice``): the operands'
    e4m3 copies in its token counts, cuDNN's kernel, the output restored as a ``[B, H, S, D]`` view
    of ``[B, S, H, D]`` memory."""
    from sgdiff.kernels.triton import fp8_heads

    q8, k8, v8, q_scale, k_scale, v_mean, v_scale = fp8_heads.quantize_operands(q, k, v, *plan.rows)
    o8 = torch.empty_like(q8)
    plan.run(q8, k8, v8, q_scale, k_scale, o8, choice)
    return fp8_heads.restore_heads(o8, v_mean, v_scale, q.dtype, q.shape[2]).transpose(1, 2)


def geometries(device: torch.device, b, h, s_q, s_k, d, is_causal, sm_scale):
    """The graphs a geometry may run as: as it is where cuDNN takes it, and padded to
    :data:`PAD` tokens where that changes the counts (on an H100, Wan's 32760 tokens ran 10-11%
    faster padded to 32768: bench/results/runs/attention-fp8-plans-h100-64d9dc0.json)."""
    plans, refusal = [], None
    for pad in (False, True):
        if pad and (padded(s_q), padded(s_k)) == (s_q, s_k):
            break
        try:
            plans.append(_Plan(device, b, h, s_q, s_k, d, is_causal, sm_scale, pad))
        except Exception as exc:
            refusal = exc
            log.info("sgdiff: cuDNN's FP8 attention refuses %d x %d tokens %s (%s: %s)", s_q, s_k,
                     "padded" if pad else "as they are", type(exc).__name__, str(exc)[:200])
    if not plans:
        raise refusal
    return plans


def chosen_plan(key: tuple, q, k, v) -> _Plan:
    """The graph and plan this geometry runs: at its first launch on the GPU, outside a capture,
    every plan of every graph (:func:`geometries`, :meth:`_Plan.plans`) timed on the call's
    operands as the whole launch (:func:`sgdiff.kernels.tuning.fastest`: the heuristics' plan of
    the first graph kept unless another is faster by more than its margin) and the fastest
    selected; elsewhere the first graph with its heuristics' plan. Where the timing breaks, that
    one too (logged)."""
    plans = geometries(q.device, *key[1:])
    if q.is_cuda and not torch.cuda.is_current_stream_capturing():
        try:
            options = [(plan, choice) for plan in plans for choice in plan.plans(q.device)]
            best, times = tuning.fastest([functools.partial(attend, plan, choice=choice) for plan, choice in options],
                                         (q, k, v))
            plan, (index, _) = options[best]
            plan.select(index)
            log.info("sgdiff: cuDNN's FP8 attention %s: %s us; kept %s%s", key[1:6],
                     [f"{'padded ' if p.pad else ''}{i}: {t * 1e6:.1f}" for (p, (i, _)), t in zip(options, times)],
                     "padded " if plan.pad else "", plan.graph.get_plan_name_at_index(index))
            return plan
        except Exception as exc:
            log.info("sgdiff: cuDNN's FP8 attention keeps its heuristics' plan: timing the others failed (%s: %s)",
                     type(exc).__name__, str(exc)[:200])
            plans[0].graph.build_plans()
            plans[0].workspace_bytes = max(int(plans[0].graph.get_workspace_size()), 1)
    return plans[0]


_handles: Dict[int, object] = {}
_plans: Dict[tuple, _Plan] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else _compat.current_cuda_device()


def _stream(device: torch.device) -> int:
    """torch's current stream on ``device``, as cuDNN takes it."""
    return _compat.current_raw_stream(_index(device))


def _handle(device: torch.device):
    """The cuDNN handle of ``device`` (one a device, made on first use)."""
    index = _index(device)
    handle = _handles.get(index)
    if handle is None:
        with torch.cuda.device(index):
            handle = _handles[index] = frontend().create_handle()
    return handle


def supported_layout(q, k, v, is_causal, scale) -> bool:
    """16-bit ``[B, H, S, D]`` q, k, v of one dtype and head dim (a multiple of 16 up to 256),
    each with unit stride along D, k and v of one token count; the frontend installed."""
    return (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float16, torch.bfloat16) and takes_head_dim(q.shape[-1])
            and k.shape[-1] == v.shape[-1] == q.shape[-1] and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and k.shape[2] == v.shape[2] and q.shape[2] > 0 and k.shape[2] > 0
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and available())


def bind(q, k, v, is_causal, scale):
    """The launch for this signature; its cuDNN graph is built and its plan chosen on the first
    launch (:func:`chosen_plan`; a geometry cuDNN refuses raises there, which first sight and the
    dispatcher take as a refusal)."""
    b, h, s_q, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    key = (q.device, b, h, s_q, k.shape[2], d, bool(is_causal), sm_scale)
    plan: Optional[_Plan] = _plans.get(key)

    def launch(q, k, v, is_causal, scale):
        nonlocal plan
        if plan is None:
            if key not in _plans:
                _plans[key] = chosen_plan(key, q, k, v)
            plan = _plans[key]
        return attend(plan, q, k, v)

    return launch


def attention_fp8(q, k, v, is_causal: bool, scale: Optional[float]):
    """Launch; the caller has checked :func:`supported_layout` and the device."""
    return bind(q, k, v, is_causal, scale)(q, k, v, is_causal, scale)


ATTENTION_FP8 = Impl(run=attention_fp8, supports=supported_layout, bind=bind)
