"""sgdiff::residual_gate — the gated residual update of a DiT block.

Eager chain (Flux, SD3, Sana, PixArt, Wan, QwenImage; Lumina-style ``tanh`` gates)::

    g = tanh(gate) if tanh_gate else gate     # rounded to gate.dtype
    y = g * update                            # rounded to the promoted dtype
    y = residual + y                          # rounded to the promoted dtype

with ``update`` first ``update + update_bias`` (rounded to its promoted dtype) where a linear's
bias was added after its GEMM: ATen runs a linear on a strided 3-D input (Sana's transposed
token stream, its linear attention's output) as ``bmm`` and then adds the bias; and then
``update / update_divisor``, an attention processor's ``/ attn.rescale_output_factor`` (PixArt),
which ATen computes on CUDA as ``update * (1 / divisor)`` in fp32, rounded to update's dtype.

``gate`` and ``update`` broadcast to ``residual`` ([B,1,D] or per-token [B,S,D] gates); mixed
dtypes promote as in eager (Wan: fp32 residual and gate, bf16 update). IEEE addition and
multiplication are commutative, so the operand order of the eager spelling is not carried,
but the layout it gives the output is: eager's output keeps the residual's layout
(:mod:`sgdiff.kernels.layout`) when the residual comes first, as in Sana, whose first token
stream is a transposed view, and is contiguous when the product comes first, as in PixArt.
The output has the residual's layout, or with ``residual_layout=False`` is contiguous (the
two coincide for a contiguous residual). ``out_dtype`` is a cast of the sum (Wan's
``(x.float() + y * gate).type_as(x)``), kept in registers by a kernel. The reference
implementation *is* the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.layout import cast, in_layout_of

aten = torch.ops.aten


def residual_gate_reference(
    residual: torch.Tensor,
    gate: torch.Tensor,
    update: torch.Tensor,
    tanh_gate: bool,
    residual_layout: bool = True,
    update_bias: Optional[torch.Tensor] = None,
    update_divisor: Optional[float] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    if update_bias is not None:
        update = aten.add.Tensor(update, update_bias)
    if update_divisor is not None:
        update = aten.div.Tensor(update, update_divisor)
    g = aten.tanh.default(gate) if tanh_gate else gate
    y = aten.add.Tensor(residual, aten.mul.Tensor(g, update))
    return cast(in_layout_of(y, residual) if residual_layout else y.contiguous(), out_dtype)


residual_gate = dispatch.define_op("residual_gate", residual_gate_reference)
