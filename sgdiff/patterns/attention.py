"""Family ``attention``: scaled dot-product attention by the fastest of torch's fused kernels
(``extra-high`` and up: a ``close`` op).

The chain (``F.scaled_dot_product_attention`` without a mask or dropout, as ATen traces it)::

    _scaled_dot_product_{flash,efficient,cudnn}_attention(q, k, v, ...)[0]    -> attention

A site's output is in ``[B, S, H, D]`` memory order (FlashAttention's; the op writes it so);
other outputs are not sites. At ``high`` the ``int8_attention`` family takes the sites first.
"""
from __future__ import annotations

from typing import List

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family
from sgdiff.patterns.matcher import When

FAMILY = Family("attention", after=("int8_attention",))


def patterns() -> List[ChainPattern]:
    return [ChainPattern(family="attention", name="attention", chain=When(parts.sdpa(), parts.heads_last_output),
                         op="attention", replacement=parts.sdpa_arguments, check=parts.sdpa_reason)]
