"""Output layouts the sgdiff ops promise.

An op's output must have the strides of the eager chain it replaces, or ops downstream of it
(a GEMM, SDPA, a convolution) may take another path and round differently. Two layouts occur:

* contiguous: what a chain ending in a LayerNorm or a broadcast to new dims gives;
* ``like(x)``: what an elementwise or row-wise chain over ``x`` gives (TensorIterator keeps its
  input's dim order): ``x``'s own strides when ``x`` is non-overlapping and dense (SD3's
  ``q.view(B, S, H, D).transpose(1, 2)``, Sana's transposed token stream), else dense strides
  in ``x``'s dim order (contiguous for a chunk of a contiguous tensor, channels-last for a
  chunk of a channels-last one). A kernel writes its output where it read its input.

Patterns check that the eager chain produced the layout the op promises; references enforce it
(a copy only for inputs the patterns never pass).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def cast(x: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    """``x.to(dtype)`` as eager's ``_to_copy`` runs it (x's layout kept); x itself for None: the
    cast a chain ends or starts with (Wan's ``.float()`` and ``.type_as(x)``)."""
    return x if dtype is None else torch.ops.aten._to_copy.default(x, dtype=dtype)


def contiguous_strides(shape: Sequence[int]) -> List[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous."""
    step = 1
    for stride, size in sorted((s, n) for n, s in zip(shape, strides) if n != 1):
        if stride != step:
            return False
        step *= size
    return True


def like_strides(x: torch.Tensor) -> List[int]:
    """The strides of ``like(x)`` (see the module doc)."""
    if is_dense(x.shape, x.stride()):
        return list(x.stride())
    strides, step = [0] * x.dim(), 1
    for d in sorted(range(x.dim()), key=lambda d: (x.stride(d), -d)):  # innermost first
        strides[d] = step
        step *= max(x.shape[d], 1)
    return strides


def same_strides(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Equal strides, ignoring dims of size 1 (their stride is never used)."""
    return all(n == 1 or sa == sb for n, sa, sb in zip(shape, a, b))


def in_layout_of(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` (of ``x``'s shape) in the layout ``like(x)``; ``y`` itself when it has it."""
    if tuple(y.shape) != tuple(x.shape):
        return y.contiguous()
    want = like_strides(x)
    if same_strides(y.shape, y.stride(), want):
        return y
    return torch.empty_strided(y.shape, want, dtype=y.dtype, device=y.device).copy_(y)
