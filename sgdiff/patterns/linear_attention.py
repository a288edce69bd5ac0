"""Family ``linear_attention``: the operands of a linear attention, made ready for its matmuls.

The eager chains (Sana's ``SanaLinearAttnProcessor2_0`` on the [B, heads, head_dim, tokens]
views of its q/k/v projections; the matmuls run in fp32)::

    clone(expand(relu(q).float()), contiguous)     q and k: matmul copies the transposed view
                                                   contiguous (batch and heads > 1) -> cast_copy
    relu(q).float()                                q and k where matmul reads the view as it is
                                                                                    -> cast_copy
    constant_pad_nd(v.float(), [0, 0, 0, 1], 1.0)  v with a row of ones            -> cast_copy
    (h[:, :, :-1] / (h[:, :, -1:] + eps)).flatten(1, 2).transpose(1, 2).to(dtype)
                                                   the output    -> linear_attention_out
    the output of h = bmm(scores, q's contiguous copy)            -> linear_attention_apply
    bmm(v's padded copy, k's contiguous copy)                     -> linear_attention_scores

Each becomes one pass that reads the view where it lies and writes what the matmul reads. An
fp32 model has no ``.float()`` to match: its ReLU, copy and pad fuse where they occur. Where
the output's h is the second matmul of q's copy, and neither has another user, the matmul, q's
copy and the output are one pass (``apply``, two of the family's chains): q read where it lies,
neither its fp32 copy nor h written. Likewise the first matmul with v's and k's copies
(``scores``, two chains): v and k read where they lie.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from sgdiff.patterns.matcher import Arg, Expr, Lit, Match, Op, Views
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, like_layout_reason, same_shape, tensor_meta, val

FAMILY = Family("linear_attention")

aten = torch.ops.aten

KINDS = ("apply", "scores", "relu_cast_contiguous", "relu_cast", "cast_pad", "output")


def _output_chain(h: Expr):
    num = Op(aten.slice.Tensor, h, Lit(2), Lit(0), Lit(-1))
    den = Op(aten.add.Tensor, Op(aten.slice.Tensor, h, Lit(2), Lit(-1), Arg("end")), Arg("eps"), alpha=Lit(1))
    joined = Op(aten.view.default, Op(aten.div.Tensor, num, den), Arg("shape"))
    return parts.cast(Op(aten.transpose.int, joined, Lit(1), Lit(2)), "cast")


def _relu_cast_contiguous(cast: str, x: str = "x", views: str = "views"):
    relu = Op(aten.relu.default, Arg(x), name=f"relu_{x}")
    return Op(aten.clone.default, Views(parts.maybe_cast(relu, cast), views),
              memory_format=Lit(torch.contiguous_format))


def _cast_pad(x: str, cast: str):
    return Op(aten.constant_pad_nd.default, parts.maybe_cast(Arg(x), cast), Arg("pad"), Arg("value"))


def chain(kind: str):
    if kind == "output":
        return _output_chain(Arg("h"))
    if kind == "apply":  # h = bmm(scores, q's copy) viewed [B, heads, head_dim + 1, tokens]
        h = Op(aten.view.default, Op(aten.bmm.default, Arg("scores"), Views(_relu_cast_contiguous("qcast"), "qviews")),
               Arg("hshape"), name="h")
        return _output_chain(h)
    if kind == "scores":  # bmm(v's padded copy as [B * heads, head_dim + 1, tokens], k's copy as [., tokens, head_dim])
        return Op(aten.bmm.default, Views(_cast_pad("v", "vcast"), "vviews"),
                  Views(_relu_cast_contiguous("kcast", "k", "kexpand"), "kviews"))
    relu = Op(aten.relu.default, Arg("x"), name="relu")
    if kind == "relu_cast_contiguous":
        return _relu_cast_contiguous("cast")
    if kind == "relu_cast":  # without a cast, a ReLU alone: nothing to fuse
        return parts.cast(relu, "cast")
    return _cast_pad("x", "cast")


def _dtype(m: Match) -> torch.dtype:
    """The cast's dtype; the input's where the model runs in that dtype already (no cast)."""
    return parts.cast_dtype(m, "cast") or tensor_meta(m["x"]).dtype


def replacement(kind: str):
    if kind == "output":
        return lambda m: dict(h=m["h"], eps=float(m["eps"]), dtype=parts.cast_dtype(m, "cast"))
    if kind == "apply":
        return lambda m: dict(scores=m["scores"], q=m["x"], eps=float(m["eps"]), dtype=parts.cast_dtype(m, "cast"))
    if kind == "scores":
        return lambda m: dict(v=m["v"], k=m["k"], value=float(m["value"]))
    if kind == "cast_pad":
        return lambda m: dict(x=m["x"], dtype=_dtype(m), relu=False, pad=list(m["pad"]), value=float(m["value"]),
                              contiguous=True)
    return lambda m: dict(x=m["x"], dtype=_dtype(m), relu=True, pad=[], value=0.0,
                          contiguous=kind == "relu_cast_contiguous")


def _output_reason(m: Match) -> Optional[str]:
    h, out = tensor_meta(m["h"]), tensor_meta(m.root)
    if h is None or out is None or h.dim() != 4 or h.dtype != torch.float32:
        return "not a 4-D fp32 attention output"
    B, H, R, N = h.shape
    if not parts.is_number(m["eps"]):
        return "eps is not a constant"
    if not (isinstance(m["end"], int) and m["end"] >= R):
        return "the normalizer is not the last row alone"
    if not same_shape(m["shape"], (B, H * (R - 1), N)):
        return "the heads are not joined as [B, heads * head_dim, tokens]"
    if out.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return "the cast is not to a float dtype"
    if not same_shape(out.stride(), (H * (R - 1) * N, 1, N)):
        return "the cast's output is not laid out as the op writes it"
    return None


def _apply_reason(m: Match) -> Optional[str]:
    """The output's checks, and h the matmul of q's whole contiguous fp32 copy as [B * heads,
    head_dim, tokens] by fp32 scores [B * heads, head_dim + 1, head_dim]."""
    reason = _output_reason(m)
    if reason is not None:
        return reason
    x, scores = tensor_meta(m["x"]), tensor_meta(m["scores"])
    if x is None or scores is None or x.dim() != 4 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return "q is not a 4-D float tensor"
    B, H, D, N = x.shape
    reason = _copied_as(m, "x", "qcast", "views", "qviews", (B * H, D, N))
    if reason is not None:
        return reason
    if scores.dtype != torch.float32 or not same_shape(scores.shape, (B * H, D + 1, D)):
        return "the scores are not fp32 [B * heads, head_dim + 1, head_dim]"
    if not same_shape(tensor_meta(m["h"]).shape, (B, H, D + 1, N)):
        return "the matmul's output is not viewed as [B, heads, head_dim + 1, tokens]"
    return None


def _copied_as(m: Match, x: str, cast: str, expand: Optional[str], views: str, shape) -> Optional[str]:
    """Why ``x``'s fp32 copy (cast bound to ``cast``; broadcast by the ``expand`` views before
    a contiguous copy, where there is one) is not what a matmul reads as ``shape``, or None."""
    t = tensor_meta(m[x])
    if (parts.cast_dtype(m, cast) or t.dtype) != torch.float32:
        return f"{x} is not widened to fp32"
    if expand and any(v.target is not aten.expand.default or not same_shape(val(v.args[1]), t.shape)
                      for v in m[expand]):
        return f"{x}'s copy is of a reshaped or broadcast tensor, not of {x} itself"
    if not m[views]:
        return f"the matmul reads {x}'s copy without a view"
    outer, *inner = m[views]  # the matmul's view, over expands that keep the shape
    if any(v.target is not aten.expand.default or not same_shape(val(v.args[1]), tensor_meta(v.args[0]).shape)
           for v in inner) or not same_shape(val(outer.args[1]), shape):
        return f"the matmul does not read {x}'s copy as {list(shape)}"
    return None


def _scores_reason(m: Match) -> Optional[str]:
    """pad(v) [B, heads, head_dim + 1, tokens] @ k's copy [B, heads, tokens, head_dim], both fp32,
    read as [B * heads, ., .]; the padding one row after the last."""
    v, k = tensor_meta(m["v"]), tensor_meta(m["k"])
    if v is None or k is None or v.dim() != 4 or v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return "v is not a 4-D float tensor"
    B, H, D, N = v.shape
    if k.dtype != v.dtype or not same_shape(k.shape, (B, H, N, D)):
        return "k is not [B, heads, tokens, head_dim] of v's dtype"
    if list(m["pad"]) != [0, 0, 0, 1] or not parts.is_number(m["value"]):
        return "v is not padded with one constant row after its last"
    return (_copied_as(m, "v", "vcast", None, "vviews", (B * H, D + 1, N))
            or _copied_as(m, "k", "kcast", "kexpand", "kviews", (B * H, N, D)))


def check(kind: str):
    if kind == "output":
        return _output_reason
    if kind == "apply":
        return _apply_reason
    if kind == "scores":
        return _scores_reason

    def linear_attention_check(m: Match) -> Optional[str]:
        x, out = tensor_meta(m["x"]), tensor_meta(m.root)
        if x is None or out is None or x.dim() != 4 or not x.dtype.is_floating_point:
            return "not a 4-D floating-point tensor"
        dtype = _dtype(m)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16) or out.dtype != dtype:
            return "the cast is not to a float dtype the op writes"
        if kind == "relu_cast_contiguous":
            if any(v.target is not aten.expand.default or not same_shape(val(v.args[1]), x.shape) for v in m["views"]):
                return "the copy is of a reshaped or broadcast tensor, not of the cast itself"
        if kind == "cast_pad":
            pad = m["pad"]
            if not (isinstance(pad, (list, tuple)) and len(pad) <= 4 and all(isinstance(p, int) and p >= 0 for p in pad)
                    and all(p == 0 for p in pad[0::2])):
                return "padding other than after the last two dims' ends"
            if not parts.is_number(m["value"]):
                return "the padding value is not a constant"
        if kind == "relu_cast":  # the cast keeps x's layout, as the op does
            return like_layout_reason(out, x)
        return None if out.is_contiguous() else "the chain's output is not contiguous"

    return linear_attention_check


OPS = {"output": "linear_attention_out", "apply": "linear_attention_apply", "scores": "linear_attention_scores"}
FUSED = ("apply", "scores")  # each two of the family's chains, and a matmul


def patterns() -> List[ChainPattern]:
    return [ChainPattern(family="linear_attention", name=kind, chain=chain(kind), op=OPS.get(kind, "cast_copy"),
                         replacement=replacement(kind), check=check(kind), priority=int(kind in FUSED),
                         chains=2 if kind in FUSED else 1)
            for kind in KINDS]
