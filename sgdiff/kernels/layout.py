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


def dense_order(x: torch.Tensor) -> Optional[List[int]]:
    """The dim order (outermost first) in which non-overlapping and dense ``x`` is contiguous:
    ``x.permute(order)`` is contiguous (Sana's ``[B, C, S]`` token stream read as ``[B, S, C]``
    gives ``[0, 2, 1]``); None where no order is (a chunk view, a broadcast)."""
    if not is_dense(x.shape, x.stride()):
        return None
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))
    return order if x.permute(order).is_contiguous() else None


def inverse_order(order: Sequence[int]) -> List[int]:
    """The permutation that undoes ``x.permute(order)``."""
    inverse = [0] * len(order)
    for position, d in enumerate(order):
        inverse[d] = position
    return inverse


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


def channels_last_format(dim: int) -> Optional[torch.memory_format]:
    """The channels-last memory format of a ``dim``-d [N, C, *spatial] tensor (None: it has none)."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(dim)


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is laid out channels-last and not also contiguous (C > 1 and some spatial extent)."""
    last = channels_last_format(x.dim())
    return last is not None and x.is_contiguous(memory_format=last) and not x.is_contiguous()


def as_channels_last(y: torch.Tensor) -> torch.Tensor:
    """``y`` copied to channels-last where it has such a format; else ``y``."""
    last = channels_last_format(y.dim())
    return y if last is None else y.contiguous(memory_format=last)


def channels_last_strides(shape: Sequence[int]) -> tuple:
    """The strides of a channels-last tensor of this (4-d or 5-d) shape."""
    return tuple(as_channels_last(torch.empty(tuple(shape), device="meta")).stride())


def flat_strides(shape: Sequence[int], strides: Sequence[int]) -> Optional[tuple]:
    """``(n, c, s)``: the strides of an [N, C, *spatial] tensor read as [N, C, S], its spatial
    dims one run of memory (contiguous and channels-last tensors both); None where they are not."""
    spatial = [(size, stride) for size, stride in zip(shape[2:], strides[2:]) if size != 1]
    inner = spatial[-1][1] if spatial else 1
    step = inner
    for size, stride in reversed(spatial):
        if stride != step:
            return None
        step *= size
    return (strides[0], strides[1], inner)


def map_tokens(x: torch.Tensor) -> torch.Tensor:
    """A ``[B, C, H, W]`` map as its ``[B, H, W, C]`` tokens (a view; contiguous where the map is
    channels-last): what a 1x1 convolution of the map multiplies by its weight's rows."""
    return x.permute(0, 2, 3, 1)


def tokens_map(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A ``[B H W, N]`` or ``[B, H, W, N]`` product over ``x``'s tokens as the channels-last
    ``[B, N, H, W]`` map a convolution of ``x`` gives (a view)."""
    b, _, h, w = x.shape
    return y.view(b, h, w, -1).permute(0, 3, 1, 2)


def weight_rows(w: torch.Tensor) -> torch.Tensor:
    """A weight as ``[N, K]`` rows (a 1x1 convolution's ``[N, K, 1, 1]`` viewed so)."""
    return w.reshape(w.shape[0], -1)
