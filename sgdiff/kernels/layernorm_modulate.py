"""sgdiff::layernorm_modulate — adaLN modulation of a LayerNorm over the last dim.

Eager chain (as diffusers writes it, e.g. Flux ``AdaLayerNormZero``, Sana, PixArt)::

    y = F.layer_norm(x, (D,), weight, bias, eps)    # rounded to x.dtype
    y = y * (1 + scale)                             # 1 + scale rounded to scale.dtype,
    y = y + shift                                   # each op rounded to its promoted dtype

``scale`` and ``shift`` are any tensors that broadcast to ``x`` ([B,1,D], [B,S,D], [D], ...);
``shift`` may be absent; with ``scale_plus_one=False`` the factor is ``scale`` itself.
``x_dtype``/``out_dtype``: ``x.to(x_dtype)`` is normalized and the result cast to
``out_dtype``, as in Wan's ``(norm(x.float()) * (1 + scale) + shift).type_as(x)``.
``scale_addend``/``shift_addend``: where eager summed two tensors into the scale (shift) first
— Wan 2.2's per-token ``(table + temb.float()).chunk(6, dim=2)`` — the op takes both views
and sums them itself (:mod:`sgdiff.fxpasses.addends`), so that sum never reaches memory.
The reference implementation below *is* that chain, op for op, so it is bitwise equal to
eager on every device; accelerated implementations are checked against it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layer_norm import layer_norm_reference
from sgdiff.kernels.layout import cast
from sgdiff.kernels.modulate import modulation, summed
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract


def layernorm_modulate_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor],
    scale_plus_one: bool = True,
    x_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    scale_addend: Optional[torch.Tensor] = None,
    shift_addend: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    scale, shift = summed(scale, scale_addend), summed(shift, shift_addend)
    y = modulation(layer_norm_reference(x, weight, bias, eps, x_dtype), scale, shift, scale_plus_one)
    return cast(y, out_dtype)




def _layernorm_modulate(x, weight, bias, eps, scale, shift, scale_plus_one=True, x_dtype=None, out_dtype=None):
    """The blocks' spelling: ``F.layer_norm`` (or a ``LayerNorm`` module), then the modulation."""
    if x_dtype is not None:  # Wan: (norm(x.float()) * (1 + scale) + shift).type_as(x)
        return lambda: (F.layer_norm(x.to(x_dtype), x.shape[-1:], weight, bias, eps) * (1 + scale) + shift).to(out_dtype)
    return lambda: F.layer_norm(x, x.shape[-1:], weight, bias, eps) * (1 + scale) + shift


def _examples():
    shapes = [((2, 1024, 2240), "Sana 1.6B", "table"), ((2, 4096, 1152), "PixArt-Sigma", "table"),
              ((1, 4608, 3072), "Flux.1-dev", "chunk"), ((1, 32760, 5120), "Wan 2.1 14B", "table")]
    for (B, S, D), model, form in shapes:
        dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if "Wan" in model else [])
        for dtype in dtypes:
            for affine in (False, True) if dtype == torch.bfloat16 else (False,):
                def make(t, dtype=dtype, affine=affine, form=form):
                    x = t.randn(t.B, t.S, t.D, dtype=dtype, scale=2, shift=0.5)
                    scale, shift = t.modulation(t.B, t.S, t.D, form, dtype)
                    w, b = (t.randn(t.D, dtype=dtype), t.randn(t.D, dtype=dtype)) if affine else (None, None)
                    return x, w, b, 1e-6, scale, shift, True

                yield Example(f"{model}, {form} params" + (", affine LN" if affine else ""), dict(B=B, S=S, D=D),
                              make, chain=_layernorm_modulate)

    def wan(t):  # an fp32 chain between casts, fp32 table + temb parameters
        x = t.randn(t.B, t.S, t.D, scale=2, shift=0.5)
        scale, shift = t.modulation(t.B, t.S, t.D, "table", torch.float32)
        return x, None, None, 1e-6, scale, shift, True, torch.float32, x.dtype

    yield Example("Wan 2.1 1.3B: (norm(x.float()) * (1 + scale) + shift).type_as(x)", dict(B=1, S=32760, D=1536),
                  wan, chain=_layernorm_modulate)
    def channels_first(t):  # x stored [B, D, S] and read as [B, S, D]: eager's LayerNorm copies it first
        x = t.randn(t.B, t.D, t.S, scale=2, shift=0.5).transpose(1, 2)
        scale, shift = t.modulation(t.B, t.S, t.D, "table")
        return x, None, None, 1e-6, scale, shift, True

    yield Example("PixArt-sized, x channels-first (y.transpose(1, 2))", dict(B=2, S=4096, D=1152), channels_first,
                  chain=_layernorm_modulate)

    def per_token(t):  # Wan 2.2 TI2V: the table and the per-token embedding, summed by the op
        (shift, shift_add), (scale, scale_add) = t.per_token_table(t.B, t.S, t.D, 6)[:2]
        x = t.randn(t.B, t.S, t.D, scale=2, shift=0.5)
        return x, None, None, 1e-6, scale, shift, True, torch.float32, x.dtype, scale_add, shift_add

    yield Example("Wan 2.2 TI2V 5B per-token: scale, shift = table + temb.float() (never stored)",
                  dict(B=1, S=27280, D=3072), per_token)
    yield Example("PixArt table rows", dict(B=2, S=4096, D=1152),
                  lambda t: (t.randn(t.B, t.S, t.D), None, None, 1e-6, *t.table_rows(t.B, t.D, 2), True), bench=False)


layernorm_modulate = dispatch.define_op(OpDef(
    "layernorm_modulate", Contract.BITEXACT, layernorm_modulate_reference,
    impls=(triton("layernorm_modulate"),), examples=tuple(_examples()),
    addends=(("scale", "scale_addend"), ("shift", "shift_addend")),
    doc="layer_norm(x.to(x_dtype), [D], weight, bias, eps) * (scale + 1) + shift, each eager rounding kept, "
        "cast to out_dtype",
))
