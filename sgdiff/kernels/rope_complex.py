"""sgdiff::rope_complex — rotary embedding as a complex product (diffusers ``use_real=False``).

Eager chain (QwenImage ``apply_rotary_emb_qwen``, Lumina, HiDream)::

    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))   # (x[2i], x[2i+1]) pairs
    out = torch.view_as_real(x_c * freqs).flatten(3)                        # one complex product
    out = out.type_as(x)

``freqs`` is the complex table as the product sees it (e.g. ``freqs_cis.unsqueeze(1)``).
Rounding: the complex product in complex64 (real and imaginary parts each rounded to fp32 as
ATen's complex multiply rounds them), one rounding to ``x.dtype``; ``.float()``/``type_as``
vanish for fp32 ``x``. With a complex128 table (AnyFlow's ``x.to(torch.float64)``, Lumina2's
``x.float()`` promoted by it) the product is complex128, and the result goes to ``x.dtype`` as
ATen's cast from double does: rounded to fp32 first, then to a 16-bit ``x.dtype``. The output
has ``x``'s layout. The reference implementation *is* that chain, op for op.
"""
from __future__ import annotations

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.kernels.rms_norm import to
from sgdiff.tiers import Contract

aten = torch.ops.aten


def real_dtype(freqs: torch.Tensor) -> torch.dtype:
    """The real dtype x is widened to for a product with ``freqs``: float64 for complex128."""
    return torch.float64 if freqs.dtype == torch.complex128 else torch.float32


def rope_complex_reference(
    x: torch.Tensor,
    freqs: torch.Tensor,
) -> torch.Tensor:
    pairs = aten.reshape.default(to(x, real_dtype(freqs)), list(x.shape[:-1]) + [-1, 2])
    y = aten.view_as_real.default(aten.mul.Tensor(aten.view_as_complex.default(pairs), freqs))
    y = aten.reshape.default(y, x.shape)
    return in_layout_of(to(y, x.dtype), x)


def _qwen_chain(x, freqs):
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    return lambda: apply_rotary_emb_qwen(x, freqs[:, 0], use_real=False)


def _anyflow_chain(x, freqs):
    from diffusers.models.transformers.transformer_anyflow import apply_rotary_emb

    return lambda: apply_rotary_emb(x, freqs)


rope_complex = dispatch.define_op(OpDef(
    "rope_complex", Contract.BITEXACT, rope_complex_reference, impls=(triton("rope"),),
    examples=(
        Example("Qwen-Image q, complex table (use_real=False)", dict(B=1, S=4096, H=24, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), t.polar(t.S, t.D // 2)[:, None]),
                small=dict(S=64, H=3), chain=_qwen_chain),
        Example("AnyFlow (Wan 2.1 1.3B) q, complex128 table", dict(B=1, S=32760, H=12, D=128),
                lambda t: (t.randn(t.B, t.S, t.H, t.D), t.polar(t.S, t.D // 2).to(torch.complex128)[None, :, None]),
                small=dict(S=64, H=3), chain=_anyflow_chain),
    ),
    doc="view_as_real(view_as_complex(x.float() pairs) * freqs).flatten(3).type_as(x); x.double() for complex128 freqs",
))
