"""Family ``gemm``: linear layers with the chain that follows them, as one GEMM at cuBLAS's bits.

``F.linear`` traces to ``view(x) -> addmm(bias, ., t(weight)) -> view`` (``mm`` without a
bias). The chains::

    act(linear(x))                              act: GELU-tanh, GELU, SiLU    -> linear_act
    silu_mul(*linear(x).chunk(2, -1))           a SwiGLU (sgdiff::silu_mul, rewritten by the
                                                activation family first)      -> linear_glu
    residual_gate(residual, gate, linear(x))    the gated residual after a block's output
                                                projection (sgdiff::residual_gate, rewritten
                                                by its family first)          -> linear_residual_gate
    residual + linear(x)                        an ungated residual (Wan's cross-attention; its
                                                eval Dropout's copy between, or Sana's
                                                ``linear(x) / 1.0 + residual``, sgdiff::residual_add)
                                                -> linear_residual_gate with a gate of ones
    gelu_tanh_cat(head, linear(x))              Flux single blocks' MLP stored into the cat before
                                                proj_out (the activation family's rewrite of
                                                cat([head, gelu(linear(x))], -1))  -> linear_act_cat
    linear(cat([x, x2], -1))                    Flux single blocks' proj_out  -> linear (x2)
    linear(x)                                   a large plain GEMM            -> linear

(the last two also inside the residual). Each op is tuned per signature: first sight times
the fused GEMM's configurations against cuBLAS and the chain (:mod:`sgdiff.kernels.tuning`) and
keeps cuBLAS unless one is faster by more than 2%. GEMMs with fewer than :data:`MIN_ROWS` rows
(adaLN projections, GEMVs that cuBLAS runs as split-K) and plain GEMMs under
:data:`MIN_PLAIN_FLOP` are not sites (nor reported as skipped).

On by default where the CuTe DSL GEMM runs (``Options.gemm``: a Hopper GPU with
``sgdiff[gemm]``), off elsewhere. With the Triton GEMM alone a Flux.1-dev 1024² step took
131.5 ms with the family against 127.1 without (H200, bench/results/models.md; first sight then
timed the host's launches too, and the family took the single blocks' GELU before the activation
family could write it into the cat: both since changed). With the CuTe DSL GEMM too (Hopper,
``sgdiff[gemm]``), on an H100: Flux.1-dev's step 128.4 ms against 133.0 without (the single
blocks' MLP stored into the cat included), Wan 2.1's 511.2 against 522.8, Sana's 15.2 against
15.4 (first sight keeps cuBLAS at its GEMMs); bench/results/runs/h100-2026-12-06-h.md.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
from sgdiff.kernels import registry
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, broadcast_reason, same_shape, same_size, tensor_meta
from sgdiff.patterns.matcher import AnyOf, Arg, Filled, Items, Lit, Match, Op, Views, When, getitem

# after the activation family: where Flux single blocks' GELU feeds the cat before proj_out,
# gelu_tanh_cat writes it there, and linear_act_cat takes that op with its projection (the GEMM
# stores into the cat); on by default only where the CuTe DSL GEMM runs (Options.gemm)
FAMILY = Family("gemm", after=("residual_gate", "activation", "fp8_gemm"), default=False)

aten = torch.ops.aten

MIN_ROWS = 64
MIN_PLAIN_FLOP = 2 ** 33  # ~12 us of an H200's bf16 GEMM: a call site's host time is noise beside it

#: the activations the GEMM's epilogue applies, by the name linear_act takes
ACTS = {
    "gelu_tanh": lambda inner: Op(aten.gelu.default, inner, approximate=Lit("tanh")),
    "gelu": lambda inner: Op(aten.gelu.default, inner, approximate=Lit("none")),
    "silu": lambda inner: Op(aten.silu.default, inner),
}


def _linear(x) -> AnyOf:
    """``F.linear`` of ``x`` as ATen traces it; the GEMM node is bound as ``mm``."""
    rows = Views(x, "x_views")
    weight_t = Op(aten.t.default, Arg("weight"), shared=True)
    return AnyOf(Op(aten.addmm.default, Arg("bias"), rows, weight_t, beta=Lit(1), alpha=Lit(1), name="mm"),
                 Op(aten.mm.default, rows, weight_t, name="mm"))


LINEAR = _linear(Arg("x"))
LINEAR_CAT = _linear(Op(aten.cat.default, Items(Arg("x"), Arg("x2")), Arg("dim"), name="cat"))


def _enough_rows(node) -> bool:
    """A 16-bit output of at least MIN_ROWS rows (fp32 GEMMs have no kernel here; fewer rows:
    adaLN projections, GEMVs cuBLAS runs as split-K; neither is a site, so neither is reported)."""
    out = tensor_meta(node)
    if out is None or out.dim() < 1 or out.dtype not in parts.HALF:
        return False
    rows = _known(out.numel() // out.shape[-1]) if _known(out.shape[-1]) else None
    return rows is None or rows >= MIN_ROWS


def _large(node) -> bool:
    """A plain GEMM of at least MIN_PLAIN_FLOP (smaller: cuBLAS's call costs less host time
    than a call site; not a site)."""
    out = tensor_meta(node)
    if out is None or out.dim() != 2 or not isinstance(node.args[-1], torch.fx.Node):
        return False
    w = tensor_meta(node.args[-1])  # the transposed weight where the node is a GEMM: [K, N]
    if w is None or w.dim() != 2:  # any other 2-D op (a product by a 0-d tensor): not a GEMM
        return False
    sizes = [_known(s) for s in (*out.shape, w.shape[0])]
    return _enough_rows(node) and (None in sizes or 2 * sizes[0] * sizes[1] * sizes[2] >= MIN_PLAIN_FLOP)


def _update_enough_rows(node) -> bool:
    """:func:`_enough_rows` of a residual_gate's update (the linear; the sum may be fp32)."""
    return len(node.args) > 2 and isinstance(node.args[2], torch.fx.Node) and _enough_rows(node.args[2])


def _residual_gate() -> Op:
    return Op(registry.op_def("residual_gate").load(), Arg("residual"), Arg("gate"),
              Views(AnyOf(LINEAR_CAT, LINEAR), "out_views"), Arg("gate_kind"),
              residual_layout=Arg("residual_layout"), update_bias=Arg("update_bias"),
              update_divisor=Arg("update_divisor"), out_dtype=Arg("out_dtype"))


def _linear_arguments(m: Match) -> dict:
    return dict(x=m["x"], weight=m["weight"], bias=m.get("bias"), x2=m.get("x2"))


def _known(size: Any) -> Optional[int]:
    return size if isinstance(size, int) else None


def _linear_reason(m: Match, out: Optional[torch.Tensor]) -> Optional[str]:
    """Why the match is not a linear layer the GEMM takes, or None."""
    x, weight = tensor_meta(m["x"]), tensor_meta(m["weight"])
    if out is None or x is None or weight is None or weight.dim() != 2 or x.dim() < 2:
        return "not a linear layer (2-D weight over the input's last dim)"
    if x.dtype not in parts.HALF or weight.dtype != x.dtype:
        return "the linear is not in one 16-bit dtype"
    x2 = tensor_meta(m.get("x2")) if "x2" in m else None
    k = x.shape[-1] + (x2.shape[-1] if x2 is not None else 0)
    if not same_size(k, weight.shape[1]):
        return "not a linear layer (2-D weight over the input's last dim)"
    if "x2" in m:
        if x2 is None or x2.dtype != x.dtype or x2.dim() != x.dim() or not same_shape(x2.shape[:-1], x.shape[:-1]):
            return "the cat's operands do not share their leading dims and dtype"
        if not isinstance(m["dim"], int) or m["dim"] not in (-1, x.dim() - 1):
            return "the cat is not along the last dim"
    bias = tensor_meta(m.get("bias"))
    if m.get("bias") is not None and (bias is None or bias.dim() != 1 or bias.dtype != x.dtype):
        return "the bias is not a 1-D tensor of the linear's dtype"
    views = (*m["x_views"], *m.get("out_views", ()))
    if any(v.target not in parts.RESHAPES for v in views):
        return "the linear's input or output is sliced or broadcast, not only reshaped"
    for v in m.get("out_views", ()):  # a view read elsewhere would keep the plain GEMM alive
        if v is not m.root and any(u not in m.nodes for u in v.users):
            return "the linear's output is read outside the chain"
    if not same_shape(out.shape, (*x.shape[:-1], weight.shape[0])):
        return "the chain's output is not the linear's output reshaped back to the input's leading dims"
    return None


def _act_reason(m: Match) -> Optional[str]:
    out = tensor_meta(m.root)
    if out is None or not out.is_contiguous():
        return "the activation's output is not contiguous"
    return _linear_reason(m, out)


def _residual_reason(m: Match) -> Optional[str]:
    out = tensor_meta(m.root)
    reason = _linear_reason(m, out)
    if reason:
        return reason
    if m["update_bias"] is not None or m["update_divisor"] is not None:
        return "the update has its own bias or divisor (a bmm's linear): residual_gate's kernel takes it"
    return _residual_tensor_reason(tensor_meta(m["residual"]), out) or broadcast_reason(m["gate"], out, "the gate")


def _residual_tensor_reason(residual: Optional[torch.Tensor], out: torch.Tensor) -> Optional[str]:
    """Why the residual is not one the GEMM's epilogue reads as a tile beside its output, or None."""
    if residual is None or not same_shape(residual.shape, out.shape) or not residual.is_contiguous():
        return "the residual is not a contiguous tensor of the output's shape"
    if residual.dim() not in (2, 3):
        return "the residual is not [B, S, N] or [S, N]"
    return None


def _residual_add() -> AnyOf:
    """``residual + linear(x)`` (either order; the linear maybe copied by an eval Dropout), or
    sgdiff::residual_add of a linear divided or scaled by a number (rewritten by the residual_gate
    family first)."""
    update = AnyOf(Op(aten.clone.default, Views(LINEAR, "out_views"), name="copy"), Views(LINEAR, "out_views"))
    return AnyOf(Op(aten.add.Tensor, update, Arg("residual"), alpha=Lit(1), commutative=True),
                 Op(registry.op_def("residual_add").load(), Arg("residual"), update, Arg("update_divisor"),
                    Arg("update_first"), update_scale=Arg("update_scale")))


def _residual_add_reason(m: Match) -> Optional[str]:
    """Why ``residual + linear(x)`` is not ``residual + 1 * linear(x)`` bit for bit through the
    gated residual's GEMM, or None: one 16-bit dtype (no promotion), a contiguous residual of the
    output's shape, a divisor or scale (if any) of exactly 1."""
    out = tensor_meta(m.root)
    reason = _linear_reason(m, out)
    if reason:
        return reason
    if any(m.get(k) not in (None, 1.0) for k in ("update_divisor", "update_scale")):
        return "the update is divided or scaled by a number other than 1"
    copy = m.get("copy")
    if copy is not None and any(u not in m.nodes for u in copy.users):
        return "the linear's output is read outside the chain"
    residual = tensor_meta(m["residual"])
    if residual is None or residual.dtype != out.dtype or tensor_meta(m["x"]).dtype != out.dtype:
        return "the residual and the linear do not share one dtype"
    return _residual_tensor_reason(residual, out)


def _residual_add_arguments(m: Match) -> dict:
    out = tensor_meta(m.root)
    return dict(_linear_arguments(m), residual=m["residual"], gate_kind="plain",
                gate=Filled((out.shape[-1],), 1.0, out.dtype, out.device))


def _act_cat() -> Op:
    """``gelu_tanh_cat(head, linear(x))``: the activation family's one op for a GELU-tanh stored
    into the cat after it, of a projection."""
    return Op(registry.op_def("gelu_tanh_cat").load(), Arg("head"), Views(LINEAR, "out_views"))


def _act_cat_reason(m: Match) -> Optional[str]:
    head, projection = tensor_meta(m["head"]), tensor_meta(m.root.args[1])
    if head is None or projection is None or head.dtype != projection.dtype or head.dim() != projection.dim() \
            or not same_shape(head.shape[:-1], projection.shape[:-1]):
        return "the cat's head does not share the projection's leading dims and dtype"
    return _linear_reason(m, projection)


def _glu(gate_first: bool) -> Op:
    """``silu_mul(gate, hidden)`` (the activation family's rewrite of a SwiGLU) of the two halves of
    one linear's output, ``chunk(2, -1)`` traced as a ``split``."""
    split = Op(aten.split.Tensor, Views(LINEAR, "out_views"), Arg("half"), Arg("dim"), name="split")
    gate, hidden = (getitem(split, 0), getitem(split, 1)) if gate_first else (getitem(split, 1), getitem(split, 0))
    return Op(registry.op_def("silu_mul").load(), gate, hidden, wide_silu=Arg("wide_silu"))


def _glu_reason(m: Match) -> Optional[str]:
    out, projection, weight = tensor_meta(m.root), tensor_meta(m["split"].args[0]), tensor_meta(m["weight"])
    if out is None or projection is None or weight is None or not out.is_contiguous():
        return "the SwiGLU's output is not contiguous"
    if not (isinstance(m["dim"], int) and m["dim"] in (-1, projection.dim() - 1)
            and isinstance(m["half"], int) and 2 * m["half"] == weight.shape[0]):
        return "the linear's output is not split in two halves along its last dim"
    return _linear_reason(m, projection)


def patterns() -> List[ChainPattern]:
    found = [ChainPattern(
        family="gemm", name="gemm_residual_gate", chain=When(_residual_gate(), _update_enough_rows), op="linear_residual_gate",
        replacement=lambda m: dict(_linear_arguments(m), residual=m["residual"], gate=m["gate"],
                                   gate_kind=m["gate_kind"], out_dtype=m["out_dtype"]),
        check=_residual_reason, priority=3),
        ChainPattern(family="gemm", name="gemm_residual_add", chain=When(_residual_add(), _enough_rows),
                     op="linear_residual_gate", replacement=_residual_add_arguments, check=_residual_add_reason,
                     priority=3)]
    for act, chain in ACTS.items():
        found.append(ChainPattern(
            family="gemm", name=f"gemm_{act}", chain=When(chain(Views(LINEAR, "out_views")), _enough_rows),
            op="linear_act",
            replacement=lambda m, act=act: dict(x=m["x"], weight=m["weight"], bias=m.get("bias"), act=act),
            check=_act_reason, priority=2))
    found.append(ChainPattern(
        family="gemm", name="gemm_gelu_tanh_cat", chain=When(_act_cat(), _enough_rows), op="linear_act_cat",
        replacement=lambda m: dict(head=m["head"], x=m["x"], weight=m["weight"], bias=m.get("bias"), act="gelu_tanh"),
        check=_act_cat_reason, priority=2))
    for gate_first in (True, False):
        found.append(ChainPattern(
            family="gemm", name=f"gemm_swiglu_gate_{'first' if gate_first else 'second'}",
            chain=When(_glu(gate_first), _enough_rows), op="linear_glu",
            replacement=lambda m, gate_first=gate_first: dict(x=m["x"], weight=m["weight"], bias=m.get("bias"),
                                                              gate_first=gate_first, wide_silu=m["wide_silu"]),
            check=_glu_reason, priority=2))
    found.append(ChainPattern(family="gemm", name="gemm_cat", chain=When(Views(LINEAR_CAT, "out_views"), _enough_rows),
                              op="linear",
                              replacement=_linear_arguments, check=lambda m: _linear_reason(m, tensor_meta(m.root)),
                              priority=1))
    found.append(ChainPattern(family="gemm", name="gemm", chain=When(LINEAR, _large), op="linear",
                              replacement=_linear_arguments, check=lambda m: _linear_reason(m, tensor_meta(m.root))))
    return found

