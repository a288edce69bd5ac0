"""sgdiff::residual_gate — the gated residual update of a DiT block.

Eager chain (Flux, SD3, Sana, PixArt, Wan, QwenImage; Lumina-style ``tanh`` gates, and
``sigmoid`` gates as gated attention outputs and GLU-style residuals write them)::

    g = gate, tanh(gate) or sigmoid(gate)     # gate_kind "plain", "tanh", "sigmoid"; rounded to gate.dtype
    y = g * update                            # rounded to the promoted dtype
    y = y.to(product_dtype)                   # where eager casts the product (Mochi's bf16 update)
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
``(x.float() + y * gate).type_as(x)``), kept in registers by a kernel. ``gate_addend``: where
eager summed the gate from two tensors (Wan 2.2's per-token ``table + temb.float()``), the op
takes both and sums them itself (:mod:`sgdiff.fxpasses.addends`). ``product_dtype``: a cast of
the product before the sum, as Mochi's modulated RMSNorm writes its bf16 update from an fp32
norm, ``x + (rms_norm(y.float()) * tanh(gate)).to(x.dtype)``. The reference
implementation *is* the chain.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import cast, in_layout_of
from sgdiff.kernels.modulate import summed
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten

#: what a gate may go through before the product, by the name the op takes (``gate_kind``);
#: "plain": nothing
GATE_FUNCTIONS = {"tanh": aten.tanh.default, "sigmoid": aten.sigmoid.default}
GATE_KINDS = ("plain", *GATE_FUNCTIONS)


def residual_gate_reference(
    residual: torch.Tensor,
    gate: torch.Tensor,
    update: torch.Tensor,
    gate_kind: str,
    residual_layout: bool = True,
    update_bias: Optional[torch.Tensor] = None,
    update_divisor: Optional[float] = None,
    out_dtype: Optional[torch.dtype] = None,
    gate_addend: Optional[torch.Tensor] = None,
    product_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    gate = summed(gate, gate_addend)
    if update_bias is not None:
        update = aten.add.Tensor(update, update_bias)
    if update_divisor is not None:
        update = aten.div.Tensor(update, update_divisor)
    if gate_kind not in GATE_KINDS:
        raise ValueError(f"unknown gate kind {gate_kind!r}; known: {', '.join(GATE_KINDS)}")
    g = gate if gate_kind == "plain" else GATE_FUNCTIONS[gate_kind](gate)
    y = cast(aten.mul.Tensor(g, update), product_dtype)
    y = aten.add.Tensor(residual, y)
    return cast(in_layout_of(y, residual) if residual_layout else y.contiguous(), out_dtype)


def _wan_chain(residual, gate, update, *rest):
    return lambda: (residual.float() + update.float() * gate).type_as(residual)


def _examples():
    for (B, S, D), model in (((2, 1024, 2240), "Sana 1.6B"), ((2, 4096, 1152), "PixArt-Sigma"),
                             ((1, 4608, 3072), "Flux.1-dev"), ((1, 32760, 5120), "Wan 2.1 14B")):
        yield Example(f"{model}, gate [B,1,D] chunk", dict(B=B, S=S, D=D),
                      lambda t: (t.randn(t.B, t.S, t.D), t.chunks(t.B, t.D, 6)[2], t.randn(t.B, t.S, t.D), "plain"))
    # Wan keeps the residual stream and the gates in fp32; the update is bf16
    yield Example("Wan 2.1 14B, fp32 stream and gate, bf16 update", dict(B=1, S=32760, D=5120),
                  lambda t: (t.randn(t.B, t.S, t.D, dtype=torch.float32), t.chunks(t.B, t.D, 6, torch.float32)[2],
                             t.randn(t.B, t.S, t.D), "plain"))
    # PixArt's self-attention: the update divided by rescale_output_factor, then gated
    yield Example("self-attention: x + g * (attn / 1.0)", dict(B=2, S=1024, D=2240),
                  lambda t: (t.randn(t.B, t.S, t.D), t.chunks(t.B, t.D, 6)[2], t.randn(t.B, t.S, t.D), "plain",
                             True, None, 1.0))
    # Wan 2.1 1.3B's blocks: (x.float() + y.float() * gate).type_as(x), gate an fp32 chunk
    yield Example("Wan 2.1 1.3B: (x.float() + y.float() * gate).type_as(x)", dict(B=1, S=32760, D=1536),
                  lambda t: (t.randn(t.B, t.S, t.D), t.table_chunks(t.B, t.D, 6, torch.float32)[2],
                             t.randn(t.B, t.S, t.D), "plain", True, None, None, torch.bfloat16), chain=_wan_chain)
    def per_token(t):  # Wan 2.2 TI2V: the gate as the table and per-token embedding the op sums
        gate, gate_add = t.per_token_table(t.B, t.S, t.D, 6)[2]
        return (t.randn(t.B, t.S, t.D), gate, t.randn(t.B, t.S, t.D), "plain", True, None, None, torch.bfloat16,
                gate_add)

    yield Example("Wan 2.2 TI2V 5B per-token: gate = table + temb.float() (never stored)", dict(B=1, S=27280, D=3072),
                  per_token)
    # Mochi 1 at 848x480 x 163 frames: x + (rms_norm(y.float()) * tanh(gate)).to(bf16), the fp32 update's
    # product cast before the sum
    yield Example("Mochi: x + (fp32 update * tanh(gate)).to(bf16)", dict(B=1, S=44520, D=3072),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, 1, t.D), t.randn(t.B, t.S, t.D, dtype=torch.float32),
                             "tanh", True, None, None, None, None, torch.bfloat16))
    yield Example("Lumina tanh gate", dict(B=2, S=4352, D=2304),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, 1, t.D), t.randn(t.B, t.S, t.D), "tanh"), bench=False)
    yield Example("per-token sigmoid gate", dict(B=1, S=4608, D=3072),
                  lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.B, t.S, t.D, scale=4), t.randn(t.B, t.S, t.D), "sigmoid"),
                  chain=lambda residual, gate, update, *rest: lambda: update * torch.sigmoid(gate) + residual)


residual_gate = dispatch.define_op(OpDef(
    "residual_gate", Contract.BITEXACT, residual_gate_reference, impls=(triton("residual_gate"),),
    examples=tuple(_examples()), addends=(("gate", "gate_addend"),),
    doc="residual + g * update with g = gate, tanh(gate) or sigmoid(gate) (gate_kind), in eager's promoted dtypes and the residual's "
        "layout (contiguous with residual_layout=False); the update maybe + a bias, / a divisor; the product maybe "
        "cast to product_dtype, the sum to out_dtype",
))
