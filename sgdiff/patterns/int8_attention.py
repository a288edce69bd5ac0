"""Family ``int8_attention``: scaled dot-product attention with q k^T in INT8 (``high`` tier only:
an ``approx`` op).

The chain (``F.scaled_dot_product_attention`` without a mask or dropout)::

    _scaled_dot_product_{flash,efficient,cudnn}_attention(q, k, v, ...)[0]    -> attention_int8

A site's output is in ``[B, S, H, D]`` memory order, as for the ``attention`` family. The
kernel takes head dims of 32, 64 and 128, non-causal attention: where a graph holds a site it
does not take, none of the graph's sites is rewritten here (one graph never mixes numerics
within a family) and the ``attention`` family, which runs next, takes them all.
"""
from __future__ import annotations

from typing import List, Optional

from sgdiff.kernels.attention_int8 import HEAD_DIMS
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import Match, When

FAMILY = Family("int8_attention")


def _reason(m: Match) -> Optional[str]:
    reason = parts.sdpa_reason(m)
    if reason:
        return reason
    if m["is_causal"] is not False:
        return "causal attention (the INT8 kernel has no causal mask)"
    if tensor_meta(m["q"]).shape[-1] not in HEAD_DIMS:
        return f"head dim {tensor_meta(m['q']).shape[-1]} (the INT8 kernel takes {', '.join(map(str, HEAD_DIMS))})"
    return None


def patterns() -> List[ChainPattern]:
    return [ChainPattern(family="int8_attention", name="attention_int8",
                         chain=When(parts.sdpa(), parts.heads_last_output), op="attention_int8",
                         replacement=parts.sdpa_arguments, check=_reason)]
