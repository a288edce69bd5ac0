"""sgdiff::attention on CUDA: fused attention kernels, the fastest for each signature.

Each candidate is called directly (no backend selector): cuDNN's
``_scaled_dot_product_cudnn_attention``, ``_scaled_dot_product_flash_attention`` and
``_scaled_dot_product_efficient_attention``, and, where ``flash-attn-4`` is installed,
FlashAttention-4's CuTe DSL forward (a candidate that raises on a signature, a head dim it
lacks, drops out there). At first sight of a signature (outside a CUDA-graph capture) every
candidate that runs on it is timed against the others (:class:`sgdiff.kernels.tuning.FirstSight`),
the kernel eager's selector picks for the operands first (:func:`eager_first`: it is kept unless
another beats it by the margin, so a tie keeps eager's bits; torch 2.11 on Hopper picks cuDNN's at
DiT shapes, where FlashAttention-2 took 1.6-2x its time:
bench/results/runs/attention-16-probe-h100-d2b5d7b.json); during a capture, that kernel runs,
unsettled. The output is put in ``[B, S, H, D]`` memory order (a copy only where a kernel wrote
another).
"""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional, Tuple

import torch

from sgdiff import _compat
from sgdiff.kernels import tuning
from sgdiff.kernels.attention import heads_last
from sgdiff.kernels.registry import Impl

aten = torch.ops.aten


def _flash(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, is_causal, scale=scale)[0]


def _cudnn(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_cudnn_attention.default(q, k, v, None, False, 0.0, is_causal, scale=scale)[0]


def _efficient(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False, 0.0, is_causal,
                                                                scale=scale)[0]


def _fa4(q, k, v, is_causal, scale):
    """FlashAttention-4's CuTe DSL forward (``flash-attn-4``; Hopper and Blackwell), on the
    ``[B, S, H, D]`` views of the operands; its output viewed back as ``[B, H, S, D]``."""
    from flash_attn.cute.interface import flash_attn_func

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                          causal=is_causal)
    return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)


def _has_fa4() -> bool:
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:  # a flash_attn without the cute package
        return False


CANDIDATES: Tuple[Tuple[str, Callable], ...] = (("flash", _flash), ("cudnn", _cudnn), ("efficient", _efficient),
                                                *((("fa4", _fa4),) if _has_fa4() else ()))

FIRST_SIGHT = tuning.FirstSight("attention")


def eager_first(q, k, v, is_causal, scale) -> Tuple[Tuple[str, Callable], ...]:
    """:data:`CANDIDATES` with the one eager's selector picks for these operands first (as they
    are where it names none of them)."""
    eager = _compat.sdpa_backend(q, k, v, is_causal, scale)
    return tuple(sorted(CANDIDATES, key=lambda candidate: candidate[0] != eager))


def choose(q, k, v, is_causal, scale) -> Tuple[str, Callable]:
    """The fastest candidate for this signature, chosen once (``(name, fn)``)."""
    key = (tuple(q.shape), q.device, q.dtype, is_causal, scale, *[(t.shape, t.stride()) for t in (q, k, v)])
    return FIRST_SIGHT.choose(key, eager_first(q, k, v, is_causal, scale), (q, k, v, is_causal, scale))


def choices() -> list:
    """``[(q's shape, kernel)]``: what first sight chose for each signature met so far."""
    return FIRST_SIGHT.choices()


def supported_layout(q, k, v, is_causal, scale) -> bool:
    return (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in (torch.float16, torch.bfloat16) and q.numel() > 0 and k.numel() > 0)


def bind(q, k, v, is_causal, scale):
    name, fn = choose(q, k, v, is_causal, scale)

    def launch(q, k, v, is_causal, scale):
        return heads_last(fn(q, k, v, is_causal, scale))

    return launch


def attention(q, k, v, is_causal: bool, scale: Optional[float]):
    return bind(q, k, v, is_causal, scale)(q, k, v, is_causal, scale)


ATTENTION = Impl(run=attention, supports=supported_layout, bind=bind)
