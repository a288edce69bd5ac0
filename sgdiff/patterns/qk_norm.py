"""Family ``qk_norm``: the normalization of queries and keys before attention.

The eager chains: an RMSNorm (any of its eager forms: ``F.rms_norm``/``torch.nn.RMSNorm``
composite or fused, diffusers' ``RMSNorm``) or a LayerNorm over ``head_dim`` of a tensor split
into heads (Flux, Flux2, SD3.5, QwenImage, CogVideoX), or over all heads before the split
(Wan's ``norm_q``/``norm_k``, then ``unflatten(2, (heads, -1))``; LTX-Video's, with the rotary
embedding over the whole width between the norm and the split). A norm is a QK-norm by where
it sits, not by how it is written: its input is a projection split into heads, or every user
splits its output into heads. Other norms (QwenImage's ``txt_norm``) are not sites. Variants come from
:class:`QkNormKey`.

Where ``F.rms_norm``'s fused form over ``head_dim`` = 128 feeds nothing but the RoPE that the
``rope`` family (applied before this one) turned into ``sgdiff::rope`` (Flux single blocks), the
two become one ``sgdiff::rms_norm_rope``; where two such norms are joined along the sequence
first (Flux double blocks: text, then image), ``sgdiff::rms_norm_cat_rope``; where the fused
form over every head feeds nothing but its split into heads and a RoPE over them
(``sgdiff::rope_even_odd`` or ``sgdiff::rope``: Wan), ``sgdiff::rms_norm_heads_rope``.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import List, Optional

import torch

from sgdiff.patterns.matcher import Arg, Items, Lit, Match, Op, When, getitem
from sgdiff.kernels import registry
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, like_layout_reason, same_shape, same_size, tensor_meta

# its fused patterns match the norms feeding sgdiff::rope calls
FAMILY = Family("qk_norm", after=("rope",))

ROPE_HEAD_DIM = 128  # what sgdiff::rms_norm_rope's kernel takes

NORMS = ("rms_norm", "layer_norm")
HEADS = ("per_head", "across_heads")


@dataclasses.dataclass(frozen=True)
class QkNormKey:
    norm: str  # one of NORMS
    heads: str  # one of HEADS: normalized over head_dim, or over all heads before the split;
    # "anywhere": the norm family's (sgdiff.patterns.norm), wherever the norm stands


def chain(key: QkNormKey):
    x_check = parts.splits_heads if key.heads == "per_head" else None
    norm = parts.rms_norm(x_check) if key.norm == "rms_norm" else parts.layer_norm(x_check=x_check)
    return When(norm, parts.feeds_head_split) if key.heads == "across_heads" else norm


def replacement(key: QkNormKey):
    if key.norm == "rms_norm":
        return lambda m: dict(x=m["x"], weight=m.get("weight"), eps=m["eps"], form=parts.rms_norm_form(m)[0])
    return lambda m: dict(x=m["x"], weight=m["weight"], bias=m["bias"], eps=m["eps"])


def check(key: QkNormKey):
    norm_reason = (lambda m: parts.rms_norm_form(m)[1]) if key.norm == "rms_norm" else parts.layer_norm_reason

    def qk_norm_check(m: Match) -> Optional[str]:
        reason = parts.norm_chain_reason(m, norm_reason)
        if reason:
            return reason
        x = tensor_meta(m["x"])
        out = tensor_meta(m.root)
        if out is None:
            return "the chain's output is not a tensor"
        if key.norm == "layer_norm":  # ATen's LayerNorm writes a contiguous output
            return None if out.is_contiguous() else "the chain's output is not contiguous"
        return like_layout_reason(out, x)

    return qk_norm_check


def _fp32_rope(rope) -> bool:
    """``rope`` (an sgdiff::rope node) computes in fp32 and casts back (no ``arith_dtype``): the
    rotation the fused kernels apply."""
    return 0 < len(rope.args) <= 4 and not rope.kwargs


def _fused_rms_norm_only_into(rope) -> bool:
    """``rope`` (an sgdiff::rope node) rotates one :func:`_fused_rms_128` norm."""
    return _fp32_rope(rope) and _fused_rms_128(rope.args[0])


def _fused_rms_128(node) -> bool:
    """``node`` is ``aten._fused_rms_norm(x, ...)[0]`` over a 128-wide head, read once, whose
    weight (if any) has the input's dtype."""
    if not (parts.is_call(node, (operator.getitem,)) and len(node.users) == 1
            and parts.is_call(node.args[0], (torch.ops.aten._fused_rms_norm.default,))):
        return False
    x, weight = tensor_meta(node.args[0].args[0]), tensor_meta(node.args[0].args[2])
    return (x is not None and x.dim() >= 1 and x.shape[-1] == ROPE_HEAD_DIM
            and (weight is None or weight.dtype == x.dtype))


def _two_fused_rms_norms_only_into(rope) -> bool:
    """``rope`` rotates ``cat([norm0, norm1], 1)`` of two :func:`_fused_rms_128` norms, read once."""
    cat = rope.args[0] if _fp32_rope(rope) else None
    return (parts.is_call(cat, (torch.ops.aten.cat.default,)) and len(cat.users) == 1
            and isinstance(cat.args[0], (list, tuple)) and len(cat.args[0]) == 2
            and all(_fused_rms_128(n) for n in cat.args[0]))


def _fused_rms_norm(i: int):
    return getitem(Op(torch.ops.aten._fused_rms_norm.default, Arg(f"x{i}", check=parts.splits_heads),
                      Arg(f"shape{i}"), Arg(f"weight{i}"), Arg(f"eps{i}")), 0)


def _cat_reason(m: Match) -> Optional[str]:
    x0, x1, out = tensor_meta(m["x0"]), tensor_meta(m["x1"]), tensor_meta(m.root)
    if x0 is None or x1 is None or out is None or x0.dim() != 4 or x1.dim() != 4 or x0.dtype != x1.dtype:
        return "the two norms are not over [B, S, H, D] tensors of one dtype"
    if any(list(m[f"shape{i}"]) != [ROPE_HEAD_DIM] for i in (0, 1)):
        return "a norm is not over head_dim alone"
    eps0, eps1 = m["eps0"], m["eps1"]
    if not (eps0 is None and eps1 is None or parts.is_number(eps0) and parts.is_number(eps1) and eps0 == eps1):
        return "the two norms have different eps"
    if (m["weight0"] is None) != (m["weight1"] is None):
        return "one norm has a weight, the other not"
    return None if out.is_contiguous() else "the chain's output is not contiguous"


def rms_norm_cat_rope_pattern() -> ChainPattern:
    rope = registry.op_def("rope").load()
    joined = Op(torch.ops.aten.cat.default, Items(_fused_rms_norm(0), _fused_rms_norm(1)), Lit(1))
    return ChainPattern(
        family="qk_norm",
        name="qk_rms_norm_cat_rope",
        chain=When(Op(rope, joined, Arg("cos"), Arg("sin"), Arg("interleaved")), _two_fused_rms_norms_only_into),
        op="rms_norm_cat_rope",
        replacement=lambda m: dict(x0=m["x0"], w0=m["weight0"], x1=m["x1"], w1=m["weight1"], eps=m["eps0"],
                                   form="fused", cos=m["cos"], sin=m["sin"], interleaved=m["interleaved"]),
        check=_cat_reason,
        priority=1,
        chains=2,
    )


def rms_norm_rope_pattern() -> ChainPattern:
    rope = registry.op_def("rope").load()
    chain = Op(rope, parts.rms_norm(parts.splits_heads), Arg("cos"), Arg("sin"), Arg("interleaved"))
    return ChainPattern(
        family="qk_norm",
        name="qk_rms_norm_rope",
        chain=When(chain, _fused_rms_norm_only_into),
        op="rms_norm_rope",
        replacement=lambda m: dict(x=m["x"], weight=m.get("weight"), eps=m["eps"], form="fused", cos=m["cos"],
                                   sin=m["sin"], interleaved=m["interleaved"]),
        check=check(QkNormKey("rms_norm", "per_head")),  # the root's layout: the RoPE's output
        priority=1,  # before the norm alone takes the site
    )


def _heads_rope_reason(m: Match) -> Optional[str]:
    x, heads, out = tensor_meta(m["x"]), tensor_meta(m["heads"]), tensor_meta(m.root)
    if x is None or heads is None or out is None or not 2 <= x.dim() <= 4:
        return "the norm is not over a [..., H * D] tensor of up to 3 leading dims"
    shape = m["shape"]
    if not (isinstance(shape, (list, tuple)) and len(shape) == 1 and same_size(shape[0], x.shape[-1])):
        return "the norm is not over the last dim alone"
    if not (heads.dim() == x.dim() + 1 and same_shape(heads.shape[:-2], x.shape[:-1])):
        return "the norm's output is not split into heads along its last dim"
    weight = m["weight"]
    if weight is not None and (tensor_meta(weight) is None or tensor_meta(weight).dtype != x.dtype):
        return "the norm's weight has another dtype than its input"
    return like_layout_reason(out, heads)


def rms_norm_heads_rope_patterns() -> List[ChainPattern]:
    """A fused RMSNorm over every head (Wan's QK norm), its split into heads, then a RoPE over the
    heads (sgdiff::rope_even_odd or sgdiff::rope), as one sgdiff::rms_norm_heads_rope."""
    norm = getitem(Op(torch.ops.aten._fused_rms_norm.default, Arg("x"), Arg("shape"), Arg("weight"), Arg("eps")), 0)
    heads = Op(parts.RESHAPES, norm, name="heads")
    ropes = (("rope_even_odd", Op(registry.op_def("rope_even_odd").load(), heads, Arg("cos"), Arg("sin")),
              lambda m: "even_odd"),
             ("rope", When(Op(registry.op_def("rope").load(), heads, Arg("cos"), Arg("sin"), Arg("interleaved")),
                           _fp32_rope), lambda m: "interleaved" if m["interleaved"] else "halves"))

    def replacement(rotation):
        return lambda m: dict(x=m["x"], weight=m["weight"], eps=m["eps"], form="fused",
                              heads=tensor_meta(m["heads"]).shape[-2], cos=m["cos"], sin=m["sin"],
                              rotation=rotation(m))

    return [ChainPattern(family="qk_norm", name=f"qk_rms_norm_heads_{name}", chain=chain, op="rms_norm_heads_rope",
                         replacement=replacement(rotation), check=_heads_rope_reason, priority=1)
            for name, chain, rotation in ropes]


def patterns() -> List[ChainPattern]:
    out = [rms_norm_rope_pattern(), rms_norm_cat_rope_pattern(), *rms_norm_heads_rope_patterns()]
    for norm in NORMS:
        for heads in HEADS:
            key = QkNormKey(norm, heads)
            out.append(ChainPattern(
                family="qk_norm",
                name=f"qk_{norm}" + ("" if heads == "per_head" else "_across_heads"),
                chain=chain(key),
                op=norm,
                replacement=replacement(key),
                check=check(key),
            ))
    return out
