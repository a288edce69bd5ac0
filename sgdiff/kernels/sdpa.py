"""sgdiff::attention on CUDA: torch's fused attention kernels, the fastest for each signature.

Each candidate is an ATen op called directly (no backend selector): cuDNN's
``_scaled_dot_product_cudnn_attention``, ``_scaled_dot_product_flash_attention`` and
``_scaled_dot_product_efficient_attention``. At first sight of a signature (outside a CUDA-graph
capture) every candidate that runs on it is timed against the others
(:class:`sgdiff.kernels.tuning.FirstSight`, FlashAttention first: eager's usual kernel is kept
unless another beats it by the margin); during a capture, FlashAttention runs, unsettled. The output is
put in ``[B, S, H, D]`` memory order (a copy only where a kernel wrote another).
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

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


CANDIDATES: Tuple[Tuple[str, Callable], ...] = (("flash", _flash), ("cudnn", _cudnn), ("efficient", _efficient))

FIRST_SIGHT = tuning.FirstSight("attention")


def choose(q, k, v, is_causal, scale) -> Tuple[str, Callable]:
    """The fastest candidate for this signature, chosen once (``(name, fn)``)."""
    key = (tuple(q.shape), q.device, q.dtype, is_causal, scale, *[(t.shape, t.stride()) for t in (q, k, v)])
    return FIRST_SIGHT.choose(key, CANDIDATES, (q, k, v, is_causal, scale))


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
