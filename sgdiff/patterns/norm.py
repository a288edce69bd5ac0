"""Family ``norm``: an RMSNorm or a LayerNorm wherever it stands.

A norm is a norm: the chains the other families fuse a norm into (a QK-norm with its RoPE, a
LayerNorm or RMSNorm with its modulation) run first, and any norm they leave is rewritten on its
own, whatever feeds it and whatever reads it — an ``F.rms_norm``, ``torch.nn.RMSNorm`` or
diffusers' ``RMSNorm`` over ``[B, S, H, D]`` that no projection feeds, a text-stream norm, a
LayerNorm of a strided input (ATen's and the op's: made contiguous first). Every eager form of
the two (:func:`sgdiff.patterns.parts.rms_norm`, :func:`sgdiff.patterns.parts.layer_norm`), the
same guards and ops as the ``qk_norm`` family's (``sgdiff::rms_norm``, ``sgdiff::layer_norm``).
"""
from __future__ import annotations

from typing import List

from sgdiff.patterns import qk_norm
from sgdiff.patterns.base import ChainPattern, Family

FAMILY = Family("norm", after=("qk_norm", "modulate"))


def patterns() -> List[ChainPattern]:
    out = []
    for norm in qk_norm.NORMS:
        key = qk_norm.QkNormKey(norm, "anywhere")
        out.append(ChainPattern(family="norm", name=norm, chain=qk_norm.chain(key), op=norm,
                                replacement=qk_norm.replacement(key), check=qk_norm.check(key)))
    return out
