"""sgdiff::cast_copy — a tensor, optionally through a ReLU, cast to another dtype and optionally
padded: contiguous, or in the input's layout.

Eager chains (Sana's ``SanaLinearAttnProcessor2_0``, per block, on the [B, heads, head_dim,
tokens] views of the q/k/v projections)::

    q = relu(q).float()        # a copy in q's layout; then, where matmul cannot view it as
    k = relu(k).float()        # [B * heads, ., .] (batch > 1), expand + clone: a contiguous copy
    v = F.pad(v.float(), (0, 0, 0, 1), value=1.0)   # a row of ones under v, contiguous

Each is two or three passes over the tensor; the op is one, reading the view where it lies.
Nothing rounds: a ReLU keeps its input's values (ATen's ``clamp_min``: NaN passes, else
``max(v, 0)``), and casting to a wider float is exact. ``contiguous=False`` (no padding) keeps
the layout ``like(x)`` that the cast alone gives (:mod:`sgdiff.kernels.layout`). The reference
implementation *is* the chain.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layout import in_layout_of

aten = torch.ops.aten


def cast_copy_reference(
    x: torch.Tensor,
    dtype: torch.dtype,
    relu: bool,
    pad: list[int],
    value: float,
    contiguous: bool,
) -> torch.Tensor:
    y = aten.relu.default(x) if relu else x
    y = aten._to_copy.default(y, dtype=dtype)
    if any(pad):
        return aten.constant_pad_nd.default(y, list(pad), value)
    if contiguous:
        return aten.clone.default(y, memory_format=torch.contiguous_format)
    return in_layout_of(y, x)


cast_copy = dispatch.define_op("cast_copy", cast_copy_reference)
