"""sgdiff::attention on CUDA: torch's fused attention kernels, the fastest for each signature.

Each candidate is an ATen op called directly (no backend selector): cuDNN's
``_scaled_dot_product_cudnn_attention``, ``_scaled_dot_product_flash_attention`` and
``_scaled_dot_product_efficient_attention``. At first sight of a signature (outside a CUDA-graph
capture) every candidate that runs on it is timed against the others
(:func:`sgdiff.kernels.tuning.fastest`, FlashAttention first: eager's usual kernel is kept unless
another beats it by the margin); during a capture, the first that runs is taken. The output is
put in ``[B, S, H, D]`` memory order (a copy only where a kernel wrote another).
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch

from sgdiff.kernels import tuning
from sgdiff.kernels.attention import heads_last
from sgdiff.kernels.registry import Impl

log = logging.getLogger("sgdiff")
aten = torch.ops.aten


def _flash(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, is_causal, scale=scale)[0]


def _cudnn(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_cudnn_attention.default(q, k, v, None, False, 0.0, is_causal, scale=scale)[0]


def _efficient(q, k, v, is_causal, scale):
    return aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False, 0.0, is_causal,
                                                                scale=scale)[0]


CANDIDATES: Tuple[Tuple[str, Callable], ...] = (("flash", _flash), ("cudnn", _cudnn), ("efficient", _efficient))

_choices: Dict[tuple, Tuple[str, Callable]] = {}


def _key(q, k, v, is_causal, scale) -> tuple:
    return (q.device, q.dtype, is_causal, scale, *[(t.shape, t.stride()) for t in (q, k, v)])


def _runs(fn: Callable, args: tuple) -> bool:
    try:
        fn(*args)
        return True
    except Exception:  # the kernel does not take this signature (head dim, strides, cuDNN version)
        return False


def choose(q, k, v, is_causal, scale) -> Tuple[str, Callable]:
    """The fastest candidate for this signature, chosen once (``(name, fn)``)."""
    key = _key(q, k, v, is_causal, scale)
    chosen = _choices.get(key)
    if chosen is not None:
        return chosen
    args = (q, k, v, is_causal, scale)
    if torch.cuda.is_current_stream_capturing():  # nothing timed or settled inside a capture
        return CANDIDATES[0]
    running: List[Tuple[str, Callable]] = [(n, f) for n, f in CANDIDATES if _runs(f, args)]
    if not running:
        raise RuntimeError("no fused attention kernel takes this signature")
    best, times = tuning.fastest([f for _, f in running], args) if len(running) > 1 else (0, [0.0])
    chosen = _choices[key] = running[best]
    log.info("sgdiff: attention %s: %s (%s)", tuple(q.shape), chosen[0],
             ", ".join(f"{n} {t * 1e6:.1f} us" for (n, _), t in zip(running, times)))
    return chosen


def choices() -> list:
    """``[(q's shape, kernel)]``: what first sight chose for each signature met so far."""
    return [(tuple(key[4][0]), name) for key, (name, _) in _choices.items()]


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
