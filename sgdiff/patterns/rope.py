"""Family ``rope``: rotary position embeddings on q and on k (two sites).

The eager chains, as diffusers writes them (:mod:`sgdiff.kernels.rope` and siblings give their
rounding steps)::

    interleaved  (apply_rotary_emb, use_real_unbind_dim=-1: Flux, Flux2, CogVideoX, HunyuanDiT)
        x_rot = stack([-x_imag, x_real], -1).flatten(3)   of x.reshape(..., -1, 2).unbind(-1)
                                                          (or of x.float()'s pairs: JoyImage)
        out   = (x.float() * cos + x_rot.float() * sin).to(x.dtype)
    rotate_half  (use_real_unbind_dim=-2: Stable Audio, CogView4, Cosmos)
        x_rot = cat([-x_imag, x_real], -1)                of x.reshape(..., 2, -1).unbind(-2)
                      or cat([-x[..., D/2:], x[..., :D/2]], -1)        (Allegro, on each third of x)
                      or cat([-x2, x1], -1) of x1, x2 = x.chunk(2, -1)  (ERNIE-Image, MiniMax H3: on
                         x[..., :rotary_dim], the rest concatenated after, as it stays)
    complex      (use_real=False: QwenImage, Lumina; AnyFlow's x.to(torch.float64) with a complex128 table)
        out = view_as_real(view_as_complex(x.float().reshape(..., -1, 2)) * freqs).flatten(3).type_as(x)
    even_odd     (Wan: strided writes into empty_like)
        out[..., 0::2] = x1 * cos - x2 * sin;  out[..., 1::2] = x1 * sin + x2 * cos
    even_odd_stack  (the same rotation re-interleaved by a stack; x1, x2 = x[..., 0::2], x[..., 1::2]
                 or the unbound pairs, maybe .float(); each half cast back before the stack (Mochi) or
                 the stack after it)
        out = stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).type_as(x)

    matrix_sum   (a 2x2 rotation table per pair: Kandinsky 5 and 6)
        x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
        out = (table * x_).sum(-1).reshape(x.shape).to(dtype)       (one or two casts, or none)
    matrix_select  (PRX; BFL's original Flux code)
        x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
        out = (table[..., 0] * x_[..., 0] + table[..., 1] * x_[..., 1]).reshape(x.shape).type_as(x)

with the tables broadcast along any sequence dim. Variants come from :class:`RopeKey`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from sgdiff.patterns.matcher import AnyOf, Arg, Expr, Items, Lit, Match, Op, getitem
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, broadcast_reason, like_layout_reason, same_size, tensor_meta

aten = torch.ops.aten

FAMILY = Family("rope")

FORMS = ("interleaved", "rotate_half", "complex", "even_odd", "even_odd_stack", "matrix_sum", "matrix_select")
OPS = {"interleaved": "rope", "rotate_half": "rope", "complex": "rope_complex", "even_odd": "rope_even_odd",
       "even_odd_stack": "rope_even_odd", "matrix_sum": "rope_matrix", "matrix_select": "rope_matrix"}
MATRIX = ("matrix_sum", "matrix_select")


@dataclasses.dataclass(frozen=True)
class RopeKey:
    form: str  # one of FORMS


def _reshape(inner: Expr, name: str) -> Expr:
    return Op(parts.RESHAPES, inner, Arg(name + "_shape"), name=name)


def _pairs(x: Expr) -> Expr:
    """``x.reshape(*x.shape[:-1], -1, 2).unbind(-1)`` (or ``(2, -1)``, ``-2``): the unbind node;
    the check reads which."""
    return Op(aten.unbind.int, _reshape(x, "rope_pairs"), Arg("rope_unbind_dim"), name="rope_unbind")


def _rotated(form: str) -> Expr:
    # x's pairs, or x.float()'s (JoyImage upcasts before the split: the rotation of the widened
    # values is the widening of the rotated ones, a sign flip and a reordering being exact)
    pairs = _pairs(parts.maybe_cast(Arg("x"), "rope_upcast_pairs"))
    negated = Items(Op(aten.neg.default, getitem(pairs, 1)), getitem(pairs, 0))
    if form == "interleaved":
        return _reshape(Op(aten.stack.default, negated, Arg("rope_join_dim")), "rope_flat")
    # or the halves sliced (Allegro: cat((-x[..., D/2:], x[..., :D/2]), -1))
    sliced = Items(Op(aten.neg.default, Op(aten.slice.Tensor, Arg("x"), Arg("rope_hi_dim"), Arg("rope_hi_start"),
                                           Arg("rope_hi_end"), Lit(1))),
                   Op(aten.slice.Tensor, Arg("x"), Arg("rope_lo_dim"), Lit(0), Arg("rope_lo_end"), Lit(1)))
    # or chunked (ERNIE-Image, MiniMax H3: x1, x2 = x.chunk(2, -1); cat((-x2, x1), -1))
    halves = Op(aten.split.Tensor, Arg("x"), Arg("rope_split_size"), Arg("rope_split_dim"), name="rope_split")
    chunked = Items(Op(aten.neg.default, getitem(halves, 1)), getitem(halves, 0))
    return AnyOf(Op(aten.cat.default, negated, Arg("rope_join_dim")), Op(aten.cat.default, sliced, Arg("rope_join_dim")),
                 Op(aten.cat.default, chunked, Arg("rope_join_dim")))


def _real(form: str) -> Expr:
    x_term = Op(aten.mul.Tensor, parts.maybe_cast(Arg("x"), "rope_upcast_x"), Arg("cos"), commutative=True)
    rot_term = Op(aten.mul.Tensor, parts.maybe_cast(_rotated(form), "rope_upcast_rot"), Arg("sin"),
                  commutative=True)
    return parts.maybe_cast(Op(aten.add.Tensor, x_term, rot_term, alpha=Lit(1), commutative=True), "rope_downcast")


def _complex() -> Expr:
    pairs = _reshape(parts.maybe_cast(Arg("x"), "rope_upcast_x"), "rope_pairs")
    product = Op(aten.mul.Tensor, Op(aten.view_as_complex.default, pairs), Arg("freqs"), commutative=True)
    flat = _reshape(Op(aten.view_as_real.default, product), "rope_flat")
    return parts.maybe_cast(flat, "rope_downcast")


def _rotated_pairs(x1: Expr, x2: Expr):
    """``(x1 * cos - x2 * sin, x1 * sin + x2 * cos)``."""
    def term(a, table):
        return Op(aten.mul.Tensor, a, Arg(table), commutative=True)

    even = Op(aten.sub.Tensor, term(x1, "cos"), term(x2, "sin"), alpha=Lit(1))
    odd = Op(aten.add.Tensor, term(x1, "sin"), term(x2, "cos"), alpha=Lit(1), commutative=True)
    return even, odd


def _even_odd_stack() -> Expr:
    pairs = _pairs(Arg("x"))

    def half(start: int) -> Expr:  # x[..., start::2], or the pairs' unbound half; maybe widened (Mochi)
        sliced = AnyOf(Op(aten.slice.Tensor, Arg("x"), Arg(f"rope_slice{start}_dim"), Lit(start),
                          Arg(f"rope_slice{start}_end"), Lit(2)), getitem(pairs, start))
        return parts.maybe_cast(sliced, f"rope_upcast_half{start}", shared=True)

    even, odd = _rotated_pairs(half(0), half(1))
    # each rotated half maybe cast back before the stack (Mochi): the cast of the stack, elementwise
    halves = Items(parts.maybe_cast(even, "rope_downcast_half0"), parts.maybe_cast(odd, "rope_downcast_half1"))
    flat = _reshape(Op(aten.stack.default, halves, Arg("rope_join_dim")), "rope_flat")
    return parts.maybe_cast(flat, "rope_downcast")


def _even_odd() -> Expr:
    pairs = _pairs(Arg("x"))
    even, odd = _rotated_pairs(getitem(pairs, 0), getitem(pairs, 1))
    out = Op(aten.empty_like.default, Arg("x"), dtype=Lit(None), name="rope_out",
             memory_format=AnyOf(Lit(None), Lit(torch.preserve_format)))
    with_even = _slot(out, "rope_out", 0, even, name="rope_even")
    return _slot(with_even, "rope_even", 1, odd)


def _slot(base: Expr, base_name: str, start: int, value: Expr, name: Optional[str] = None) -> Expr:
    """``base[..., start::2] = value`` as functionalization writes it: ``slice_scatter(base,
    copy(base[..., start::2], value), -1, start, end, 2)``."""
    strided = Op(aten.slice.Tensor, Arg(base_name), Arg(f"rope_slice{start}_dim"), Lit(start),
                 Arg(f"rope_slice{start}_end"), Lit(2))
    src = AnyOf(Op(aten.copy.default, strided, value), value)
    return Op(aten.slice_scatter.default, base, src, Arg(f"rope_scatter{start}_dim"), Lit(start),
              Arg(f"rope_scatter{start}_end"), Lit(2), name=name)


def _matrix(form: str) -> Expr:
    # x as fp32 pairs [..., D/2, 1, 2]: cast, then reshape, or the other way round
    pairs = AnyOf(_reshape(parts.maybe_cast(Arg("x"), "rope_upcast_x"), "rope_pairs"),
                  parts.maybe_cast(_reshape(Arg("x"), "rope_pairs"), "rope_upcast_x"))
    if form == "matrix_sum":
        rotated = Op(aten.sum.dim_IntList, Op(aten.mul.Tensor, Arg("table"), pairs, commutative=True),
                     Arg("rope_sum_dims"), keepdim=Lit(False), dtype=Lit(None))
    else:
        def term(k: int) -> Expr:
            # the table's halves may serve q's rotation and k's (HiDream: freqs_cis[..., k] read twice)
            return Op(aten.mul.Tensor,
                      Op(aten.select.int, Arg("table"), Arg(f"rope_table_dim{k}"), Lit(k), shared=True),
                      Op(aten.select.int, pairs, Arg(f"rope_pairs_dim{k}"), Lit(k)), commutative=True)

        rotated = Op(aten.add.Tensor, term(0), term(1), alpha=Lit(1), commutative=True)
    return parts.maybe_cast(parts.maybe_cast(_reshape(rotated, "rope_flat"), "rope_mid"), "rope_downcast")


def _matrix_casts(m: Match):
    """(mid_dtype, out_dtype): the chain's casts after the rotation, in order (None: absent)."""
    casts = [parts.cast_dtype(m, name) for name in ("rope_mid", "rope_downcast") if name in m]
    return (casts[0], casts[1]) if len(casts) == 2 else (None, casts[0] if casts else None)


def _matrix_reason(form: str, m: Match, x: torch.Tensor) -> Optional[str]:
    lead, d = tuple(x.shape[:-1]), x.shape[-1]
    if not isinstance(d, int) or d % 2:
        return "the head dim is not an even number"
    if not _shape_is(m["rope_pairs"], lead + (d // 2, 1, 2)):
        return "x is not viewed as (D/2, 1, 2) pairs"
    if form == "matrix_sum":
        if not parts.is_last_dim(m["rope_sum_dims"], x.dim() + 2):
            return "the products are not summed over the last dim"
    else:
        table = tensor_meta(m["table"])
        if table is None or not all(parts.is_last_dim(m[f"rope_table_dim{k}"], table.dim())
                                    and parts.is_last_dim(m[f"rope_pairs_dim{k}"], x.dim() + 2) for k in (0, 1)):
            return "the pairs' entries are not selected along the last dim"
    if not _shape_is(m["rope_flat"], x.shape):
        return "the rotated pairs are not reshaped back to x's shape"
    wanted = x.dtype != torch.float32
    if ("rope_upcast_x" in m) != wanted or (wanted and parts.cast_dtype(m, "rope_upcast_x") != torch.float32):
        return "the rotation is not computed from x.float()" if wanted else "x is cast before the rotation"
    table = tensor_meta(m["table"])
    if table is None or not table.dtype.is_floating_point or \
            torch.promote_types(table.dtype, torch.float32) != torch.float32:
        return "the table's products are not fp32"
    return broadcast_reason(m["table"], _Shape(lead + (d // 2, 2, 2)), "table")


def chain(key: RopeKey) -> Expr:
    if key.form in MATRIX:
        return _matrix(key.form)
    if key.form == "complex":
        return _complex()
    if key.form == "even_odd":
        return _even_odd()
    if key.form == "even_odd_stack":
        return _even_odd_stack()
    return _real(key.form)


def replacement(key: RopeKey):
    if key.form in MATRIX:
        return lambda m: dict(x=m["x"], table=m["table"], from_zero=key.form == "matrix_sum",
                              mid_dtype=_matrix_casts(m)[0], out_dtype=_matrix_casts(m)[1])
    if key.form == "complex":
        return lambda m: dict(x=m["x"], freqs=m["freqs"])
    if key.form in ("even_odd", "even_odd_stack"):
        return lambda m: dict(x=m["x"], cos=m["cos"], sin=m["sin"])
    def real(m: Match) -> dict:
        arith = _arith_dtype(key.form, m, tensor_meta(m["x"]))
        return dict(x=m["x"], cos=m["cos"], sin=m["sin"], interleaved=key.form == "interleaved",
                    **({} if arith is None else dict(arith_dtype=arith)))

    return real


def check(key: RopeKey):
    def rope_check(m: Match) -> Optional[str]:
        x = tensor_meta(m["x"])
        if x is None or not x.dtype.is_floating_point or x.dim() < 2:
            return "input is not a floating-point tensor with a head dim"
        if key.form in MATRIX:
            return _matrix_reason(key.form, m, x)
        for reason in (_structure_reason(key.form, m, x), _cast_reason(key.form, m, x), _table_reason(key.form, m, x)):
            if reason:
                return reason
        out = tensor_meta(m.root)
        return "the chain's output is not a tensor" if out is None else like_layout_reason(out, x)

    return rope_check


def _shape_is(node, shape) -> bool:
    t = tensor_meta(node)
    return t is not None and len(t.shape) == len(shape) and all(same_size(a, b) for a, b in zip(t.shape, shape))


def _structure_reason(form: str, m: Match, x: torch.Tensor) -> Optional[str]:
    """The reshapes and joins pair up the last dim as the form says (and nothing else)."""
    lead, d = tuple(x.shape[:-1]), x.shape[-1]
    if form == "even_odd_stack":
        return _stack_structure_reason(m, x, lead, d)
    if form == "rotate_half" and "rope_hi_dim" in m:
        return _sliced_halves_reason(m, x, d)
    if form == "rotate_half" and "rope_split" in m:
        return _chunked_halves_reason(m, x, d)
    if form == "rotate_half":
        pair_shape, unbind_dim = lead + (2, d // 2), -2
    else:
        pair_shape, unbind_dim = lead + (d // 2, 2), -1
    if not _shape_is(m["rope_pairs"], pair_shape):
        return f"the pairs are not the last dim as {pair_shape[-2:]}"
    if form == "complex":
        return None if _shape_is(m["rope_flat"], x.shape) else "the rotated pairs are not flattened back to x's shape"
    if m["rope_unbind_dim"] not in (unbind_dim, x.dim() + 1 + unbind_dim):
        return f"unbind over dim {m['rope_unbind_dim']}, not {unbind_dim}"
    if form == "interleaved":
        if not parts.is_last_dim(m["rope_join_dim"], x.dim() + 1) or not _shape_is(m["rope_flat"], x.shape):
            return "the rotated pairs are not stacked and flattened back to x's shape"
    elif form == "rotate_half":
        if not parts.is_last_dim(m["rope_join_dim"], x.dim()):
            return "the rotated halves are not concatenated along the last dim"
    else:  # even_odd: both writes stride 2 over the last dim
        for key in ("rope_slice0_dim", "rope_slice1_dim", "rope_scatter0_dim", "rope_scatter1_dim"):
            if not parts.is_last_dim(m[key], x.dim()):
                return "the even/odd writes are not along the last dim"
        for key in ("rope_slice0_end", "rope_slice1_end", "rope_scatter0_end", "rope_scatter1_end"):
            if not _to_the_end(m[key], d):
                return "the even/odd writes stop before the end of the last dim"
    return None


def _stack_structure_reason(m: Match, x: torch.Tensor, lead: tuple, d) -> Optional[str]:
    """even_odd_stack: the halves are x's even and odd elements of the last dim, the rotated
    halves stacked along a new last dim and flattened back to x's shape."""
    if "rope_unbind" in m:
        if not _shape_is(m["rope_pairs"], lead + (d // 2, 2)) or m["rope_unbind_dim"] not in (-1, x.dim()):
            return "the pairs are not the last dim as (D/2, 2)"
    else:
        for start in (0, 1):
            dim, end = m[f"rope_slice{start}_dim"], m[f"rope_slice{start}_end"]
            if not parts.is_last_dim(dim, x.dim()) or not _to_the_end(end, d):
                return "the halves are not x's even and odd elements of the last dim"
    if not parts.is_last_dim(m["rope_join_dim"], x.dim() + 1) or not _shape_is(m["rope_flat"], x.shape):
        return "the rotated halves are not stacked along a new last dim and flattened back to x's shape"
    return None


def _sliced_halves_reason(m: Match, x: torch.Tensor, d) -> Optional[str]:
    """rotate_half with sliced halves: ``-x[..., D/2:]`` and ``x[..., :D/2]`` joined along the last dim."""
    half = d // 2 if isinstance(d, int) else None
    if not (parts.is_last_dim(m["rope_hi_dim"], x.dim()) and parts.is_last_dim(m["rope_lo_dim"], x.dim())
            and half is not None and d % 2 == 0 and m["rope_hi_start"] == half and m["rope_lo_end"] == half
            and _to_the_end(m["rope_hi_end"], d)):
        return "the halves are not x's last dim cut in two"
    if not parts.is_last_dim(m["rope_join_dim"], x.dim()):
        return "the rotated halves are not concatenated along the last dim"
    return None


def _chunked_halves_reason(m: Match, x: torch.Tensor, d) -> Optional[str]:
    """rotate_half with chunked halves: ``x.chunk(2, -1)`` (a split in two of D/2) joined as
    ``cat((-x2, x1), -1)``."""
    if not (isinstance(d, int) and d % 2 == 0 and m["rope_split_size"] == d // 2
            and parts.is_last_dim(m["rope_split_dim"], x.dim()) and len(m["rope_split"].users) == 2):
        return "the halves are not x's last dim cut in two"
    if not parts.is_last_dim(m["rope_join_dim"], x.dim()):
        return "the rotated halves are not concatenated along the last dim"
    return None


def _to_the_end(end, d) -> bool:
    """A slice end that reaches the end of a dim of size ``d`` (``x[..., 0::2]`` traces an
    end of ``sys.maxsize``)."""
    if end is None or (isinstance(end, int) and end >= 2 ** 62):
        return True
    return isinstance(end, int) and isinstance(d, int) and end >= d


def _arith_dtype(form: str, m: Match, x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype a real-table RoPE computes in where it is not the op's usual ``(x.float() * cos
    + x_rot.float() * sin).to(x.dtype)``: written without casts on a 16-bit x (each product and
    the sum in the tables' promotion with x: bf16 products of bf16 tables), or widened but not
    cast back (fp32, left in fp32); else None."""
    if form not in ("interleaved", "rotate_half") or "rope_downcast" in m:
        return None
    inner, cos, sin = tensor_meta(m.root), tensor_meta(m["cos"]), tensor_meta(m["sin"])
    if inner is None or cos is None or sin is None:
        return None
    upcasts = {name for name in ("rope_upcast_x", "rope_upcast_rot", "rope_upcast_pairs") if name in m}
    if not upcasts:
        if x.dtype == torch.float32:  # no cast to make: the op as it is
            return None
        arith = inner.dtype
    elif (upcasts in ({"rope_upcast_x", "rope_upcast_rot"}, {"rope_upcast_x", "rope_upcast_pairs"})
          and all(parts.cast_dtype(m, name) == torch.float32 for name in upcasts)):
        arith = torch.float32  # x.float() * cos is x * cos promoted where the tables are fp32
    else:
        return None
    promoted = {torch.promote_types(x.dtype, cos.dtype), torch.promote_types(x.dtype, sin.dtype), inner.dtype}
    return arith if promoted == {arith} else None


def _cast_reason(form: str, m: Match, x: torch.Tensor) -> Optional[str]:
    """``.float()`` on every operand the form upcasts, ``.to(x.dtype)`` at the end: present
    exactly when they are not no-ops (an fp32 ``x``); or a chain computed in one dtype
    throughout (:func:`_arith_dtype`)."""
    if form == "even_odd" or _arith_dtype(form, m, x) is not None:
        return None
    if form == "even_odd_stack":  # the products in the promoted dtype, the result cast to x's
        return _stack_cast_reason(m, x)
    wanted = x.dtype != torch.float32
    if form == "complex":
        reason = _complex_cast_reason(m, x)
        if reason:
            return reason
    else:
        # the rotated operand widened after the rotation, or x widened before it (never both)
        rot = [name for name in ("rope_upcast_rot", "rope_upcast_pairs") if name in m]
        if len(rot) > 1:
            return "x is widened before and after its rotation"
        for name in ["rope_upcast_x", rot[0] if len(rot) == 1 else "rope_upcast_rot"]:
            if (name in m) != wanted or (wanted and parts.cast_dtype(m, name) != torch.float32):
                return "the rotation is not computed from x.float()" if wanted else "x is cast before the rotation"
    inner = m["rope_downcast"].args[0] if "rope_downcast" in m else m.root
    inner_dtype = tensor_meta(inner).dtype
    if "rope_downcast" in m and (inner_dtype == x.dtype or parts.cast_dtype(m, "rope_downcast") != x.dtype):
        return "the result is not cast back to x's dtype"
    if "rope_downcast" not in m and inner_dtype != x.dtype:
        return "the result is not cast back to x's dtype"
    return None


def _stack_cast_reason(m: Match, x: torch.Tensor) -> Optional[str]:
    """even_odd_stack: x's halves widened to fp32 or not (both alike, where the tables' promotion
    with x is the same either way: fp32 tables), the result cast to x's dtype once: after the
    stack, or each half before it (both, to the same dtype)."""
    ups = [parts.cast_dtype(m, f"rope_upcast_half{k}") for k in (0, 1)]
    if ups[0] != ups[1] or ups[0] not in (None, torch.float32):
        return "x's halves are not both widened to fp32"
    if ups[0] is not None and any(torch.promote_types(torch.float32, t.dtype) != torch.promote_types(x.dtype, t.dtype)
                                  for t in (tensor_meta(m["cos"]), tensor_meta(m["sin"]))):
        return "x's halves are widened where the tables would not widen them"
    downs = [parts.cast_dtype(m, f"rope_downcast_half{k}") for k in (0, 1)]
    if downs[0] != downs[1] or (downs[0] is not None and "rope_downcast" in m):
        return "the rotated halves are not cast back alike"
    inner = m["rope_downcast"].args[0] if "rope_downcast" in m else m.root
    out = downs[0] or (parts.cast_dtype(m, "rope_downcast") if "rope_downcast" in m else tensor_meta(inner).dtype)
    return None if out == x.dtype else "the result is not cast back to x's dtype"


def _complex_cast_reason(m: Match, x: torch.Tensor) -> Optional[str]:
    """complex: x's pairs widened exactly, to fp32 (a no-op for an fp32 x, then absent), or to
    fp64 where the table is complex128 (AnyFlow's ``x.to(torch.float64)``): with a complex128 table
    the product is complex128 either way, the widening exact either way; with a complex64 one an
    fp64 x would make it complex128."""
    freqs = tensor_meta(m["freqs"])
    allowed = (torch.float32, torch.float64) if freqs is not None and freqs.dtype == torch.complex128 \
        else (torch.float32,)
    cast = parts.cast_dtype(m, "rope_upcast_x")
    if cast is None:
        return None if x.dtype == torch.float32 else "the rotation is not computed from x.float()"
    if x.dtype == torch.float32 and cast == torch.float32:
        return "x is cast before the rotation"
    return None if cast in allowed else "the rotation is not computed from x.float()"


def _table_reason(form: str, m: Match, x: torch.Tensor) -> Optional[str]:
    if form == "complex":
        freqs = tensor_meta(m["freqs"])
        if freqs is None or not freqs.dtype.is_complex:
            return "the frequencies are not a complex tensor"
        return broadcast_reason(m["freqs"], _Half(x), "freqs")
    target = x if form not in ("even_odd", "even_odd_stack") else _Half(x)
    for name in ("cos", "sin"):
        reason = broadcast_reason(m[name], target, name)
        if reason:
            return reason
    return None


class _Shape:
    """A shape stand-in for broadcast checks."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)

    def dim(self) -> int:
        return len(self.shape)


def _Half(x: torch.Tensor) -> _Shape:
    """One element of each pair, [..., D/2]."""
    return _Shape((*x.shape[:-1], x.shape[-1] // 2))


def patterns() -> List[ChainPattern]:
    return [
        ChainPattern(
            family="rope",
            name=f"rope_{form}",
            chain=chain(RopeKey(form)),
            op=OPS[form],
            replacement=replacement(RopeKey(form)),
            check=check(RopeKey(form)),
        )
        for form in FORMS
    ]
