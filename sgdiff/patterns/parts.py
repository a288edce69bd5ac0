"""Sub-chains that several families share: norms, `1 + scale`, casts, biased convolutions."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
from torch import fx

from sgdiff.patterns.matcher import AnyOf, Arg, Expr, Lit, Match, Op, Views, When, getitem
from sgdiff.patterns.base import same_size, tensor_meta, val

aten = torch.ops.aten

#: ops that only reshape a tensor (``reshape``, ``flatten``, ``unflatten`` trace to these)
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, *HALF)  # the dtypes the ops read and write


def layer_norm(x: str = "x", weight: str = "weight", bias: str = "bias", eps: str = "eps",
               x_check: Optional[Callable[[Any], bool]] = None, upcast: bool = False) -> Expr:
    """``F.layer_norm(x, shape, weight, bias, eps)`` in both of its ATen spellings; with
    ``upcast``, of ``x`` or of a cast of it (:func:`maybe_upcast`: ``norm(x.float())``).

    The norm output may feed several chains (one LayerNorm, two modulates), so it is shared.
    """
    source = maybe_upcast(x, x_check) if upcast else Arg(x, check=x_check)
    args = dict(input=source, normalized_shape=Arg("normalized_shape"),
                weight=Arg(weight), bias=Arg(bias), eps=Arg(eps))
    return AnyOf(
        getitem(Op(aten.native_layer_norm.default, **args, shared=True), 0, shared=True, name="norm"),
        Op(aten.layer_norm.default, **args, shared=True, name="norm"),
    )


def layer_norm_reason(m: Match) -> Optional[str]:
    """Why a match of :func:`layer_norm` is not a LayerNorm over the last dim with a constant
    eps and 1-D affine parameters (what the sgdiff ops take), or None."""
    x = tensor_meta(m["x"])
    shape = m["normalized_shape"]
    if not (isinstance(shape, (list, tuple)) and len(shape) == 1 and same_size(val(shape[0]), x.shape[-1])):
        return f"LayerNorm over {shape}, not over the last dim only"
    if not isinstance(m["eps"], float):
        return "eps is not a constant"
    return _params_reason(m, x, ("weight", "bias"), "LayerNorm")


def _params_reason(m: Match, x: torch.Tensor, names, norm: str) -> Optional[str]:
    for name in names:
        p = m.get(name)
        t = tensor_meta(p)
        if p is not None and (t is None or t.dim() != 1 or not same_size(t.shape[0], x.shape[-1])):
            return f"{norm} {name} is not a 1-D tensor over the normalized dim"
    return None


def plus_one(scale: str = "scale", views: str = "scale_views") -> Expr:
    """``1 + scale`` (traced as ``add(scale, 1)``), possibly indexed after the add:
    ``(1 + scale)[:, None, :]``. The add may have other users: it is cheap to redo."""
    return Views(AnyOf(Op(aten.add.Tensor, Arg(scale), Lit(1), alpha=Lit(1), shared=True),
                       Op(aten.add.Scalar, Arg(scale), Lit(1), alpha=Lit(1), shared=True)), views)


def cast(inner: Expr, name: str, shared: bool = False) -> Expr:
    """``inner.to(dtype)`` (``.float()``, ``.type_as``): a ``_to_copy`` that changes the dtype
    only; the node is bound to ``name`` (its dtype: :func:`cast_dtype`)."""
    return Op(aten._to_copy.default, inner, name=name, shared=shared,
              layout=AnyOf(Lit(None), Lit(torch.strided)), pin_memory=AnyOf(Lit(None), Lit(False)),
              memory_format=AnyOf(Lit(None), Lit(torch.preserve_format)))


def maybe_cast(inner: Expr, name: str, shared: bool = False) -> Expr:
    return AnyOf(cast(inner, name, shared), inner)


def cast_dtype(m: Match, name: str) -> Optional[torch.dtype]:
    """The dtype the cast bound to ``name`` rounds to, None where the chain has no such cast."""
    node = m.get(name)
    return None if node is None else node.kwargs.get("dtype")


def maybe_upcast(name: str, check: Optional[Callable[[Any], bool]] = None) -> Expr:
    """An operand, or a cast of it (``x.float()``) bound to ``<name>_upcast``; the cast may have
    other users. Which of the two the op reads is :func:`operand`'s choice."""
    return AnyOf(cast(Arg(name, check=check), f"{name}_upcast", shared=True), Arg(name, check=check))


def exact_upcast(m: Match, name: str) -> Optional[torch.dtype]:
    """The fp32 that ``name``'s cast widens a bf16/fp16 tensor to (on its device), where it has
    such a cast: a kernel can read the narrow tensor and widen it exactly; else None."""
    node = m.get(f"{name}_upcast")
    src, out = tensor_meta(m.get(name)), tensor_meta(node)
    if node is None or src is None or out is None:
        return None
    return torch.float32 if src.dtype in HALF and out.dtype == torch.float32 and out.device == src.device else None


def operand(m: Match, name: str, fold: bool) -> Any:
    """The node an op reads for ``name``: the tensor under its cast where ``fold``, else the
    value eager's chain read (the cast, if there is one)."""
    return m[name] if fold or f"{name}_upcast" not in m else m[f"{name}_upcast"]


def out_cast(inner: Expr, required: bool = False) -> Expr:
    """``inner.to(dtype)`` (Wan's ``.type_as(x)``) where the cast is the chain's only reader and
    keeps the device: the op then writes the cast's dtype (bound as ``out_cast``); unless
    ``required``, also ``inner`` alone."""
    casted = When(cast(inner, "out_cast"), _sole_cast)
    return casted if required else AnyOf(casted, inner)


def _sole_cast(node: Any) -> bool:
    if not is_call(node, (aten._to_copy.default,)) or not isinstance(node.args[0], fx.Node):
        return False
    src, out = tensor_meta(node.args[0]), tensor_meta(node)
    return (len(node.args[0].users) == 1 and src is not None and out is not None
            and out.device == src.device and out.dtype.is_floating_point)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# --- biased convolutions -------------------------------------------------------------------

#: the names a convolution inside another op's chain binds (the op's arguments of the same names)
CONV_NAMES = dict(x="conv_x", weight="conv_weight", bias="conv_bias", groups="conv_groups")


def biased_convolution(x: str = "x", weight: str = "weight", bias: str = "bias", groups: str = "groups") -> Op:
    """``F.conv2d``/``F.conv3d(x, w, b, ...)``: ``aten.convolution`` with ``transposed=False`` and a
    bias (without one there is no bias add to fold), bound as ``conv``."""
    return Op(aten.convolution.default, Arg(x), Arg(weight), Arg(bias, check=lambda b: isinstance(b, fx.Node)),
              Arg("stride"), Arg("padding"), Arg("dilation"), Lit(False), Arg("output_padding"), Arg(groups),
              name="conv")


def convolution_reason(m: Match, x: str = "x", weight: str = "weight", bias: str = "bias") -> Optional[str]:
    """Why the bound convolution is not a 2-D or 3-D one of one dtype with a 1-D bias, or None."""
    x, weight, bias, out = (tensor_meta(m[n]) for n in (x, weight, bias, "conv"))
    if x is None or weight is None or bias is None or out is None or x.dim() not in (4, 5) \
            or weight.dim() != x.dim() or bias.dim() != 1:
        return "not a 2-D or 3-D convolution with a 1-D bias"
    if not x.dtype == weight.dtype == bias.dtype == out.dtype:
        return "the convolution mixes dtypes"
    if any(not isinstance(p, int) or p != 0 for p in m["output_padding"]):
        return "output padding"
    return None


def pointwise_convolution(node: Any) -> bool:
    """A 2-D 1x1 convolution (stride 1, no padding, no dilation, one group) of a channels-last map
    of one half dtype: the GEMM of the map's ``[B H W, C]`` tokens (contiguous rows) by the weight."""
    if not is_call(node, (aten.convolution.default,)) or len(node.args) < 9:
        return False
    x, weight = (tensor_meta(a) for a in node.args[:2])
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    if x is None or weight is None or x.dim() != 4 or weight.dim() != 4 or x.dtype not in HALF \
            or weight.dtype != x.dtype:
        return False
    if transposed or groups != 1 or any(s != 1 for s in (*stride, *dilation)) \
            or any(p != 0 for p in (*padding, *output_padding)) or tuple(weight.shape[2:]) != (1, 1):
        return False
    return x.permute(0, 2, 3, 1).is_contiguous()


def convolution_args(m: Match) -> dict:
    """The op arguments of a convolution bound with :data:`CONV_NAMES`."""
    return dict(x=m["conv_x"], conv_weight=m["conv_weight"], conv_bias=m["conv_bias"], stride=m["stride"],
                padding=m["padding"], dilation=m["dilation"], conv_groups=m["conv_groups"])


# --- RMSNorm --------------------------------------------------------------------------------

def rms_norm(x_check: Optional[Callable[[Any], bool]] = None, shared: bool = False) -> Expr:
    """An RMSNorm over the last dim of ``x``, in each of its eager forms
    (:mod:`sgdiff.kernels.rms_norm` states their rounding steps)::

        F.rms_norm, composite (CPU):  [xf = x.float()] pow(xf, 2) -> mean(-1, keepdim)
                                      -> add.Scalar(eps) -> rsqrt -> xf * r [* w] [.to(x.dtype)]
        F.rms_norm, fused (CUDA):     aten._fused_rms_norm(x, [D], w, eps)[0]
        diffusers RMSNorm:            x.float().pow(2).mean(-1, keepdim) -> add.Tensor(eps)
                                      -> rsqrt -> x * r [.to(w.dtype)] * w  |  .to(x.dtype)

    Binds ``x``, ``weight`` (absent without one), ``eps`` and the nodes :func:`rms_norm_form`
    reads. ``shared`` lets the norm's nodes keep other users (one norm, two modulates).
    """
    x = Arg("x", check=x_check)
    xf = maybe_cast(x, "rms_upcast", shared)
    square_mean = Op(aten.mean.dim, Op(aten.pow.Tensor_Scalar, xf, Lit(2), shared=shared),
                     Arg("rms_dims"), Lit(True), dtype=Lit(None), shared=shared)
    inv = Op(aten.rsqrt.default, Op((aten.add.Scalar, aten.add.Tensor), square_mean,
                                    Arg("eps", check=is_number), alpha=Lit(1), shared=shared), shared=shared)
    core = Op(aten.mul.Tensor, xf, inv, commutative=True, shared=shared)

    def weighted(e: Expr) -> Expr:
        return Op(aten.mul.Tensor, e, Arg("weight"), commutative=True, shared=shared)

    fused = getitem(Op(aten._fused_rms_norm.default, x, Arg("normalized_shape"), Arg("weight"), Arg("eps"),
                       name="rms_fused", shared=shared), 0, shared=shared)
    return AnyOf(
        cast(weighted(core), "rms_downcast", shared),  # F.rms_norm of fp16/bf16 x
        weighted(cast(core, "rms_cast", shared)),  # diffusers, fp16/bf16 weight
        weighted(core),
        cast(core, "rms_downcast", shared),  # no weight, fp16/bf16 x
        core,
        fused,
    )


def rms_norm_form(m: Match) -> Tuple[Optional[str], Optional[str]]:
    """``(form, None)`` naming the eager RMSNorm a match of :func:`rms_norm` is, or
    ``(None, reason)`` when its rounding steps are those of no known form."""
    x = tensor_meta(m["x"])
    if x is None or not x.dtype.is_floating_point:
        return None, "RMSNorm input is not a floating-point tensor"
    reason = _params_reason(m, x, ("weight",), "RMSNorm")
    if reason:
        return None, reason
    weight, eps = tensor_meta(m.get("weight")), m["eps"]
    if "rms_fused" in m:
        shape = m["normalized_shape"]
        if not (isinstance(shape, (list, tuple)) and len(shape) == 1):
            return None, f"RMSNorm over {shape}, not over the last dim only"
        return ("fused", None) if eps is None or is_number(eps) else (None, "eps is not a constant")
    if not is_last_dim(m["rms_dims"], x.dim()):
        return None, f"RMSNorm mean over dims {m['rms_dims']}, not the last dim only"
    if "rms_upcast" in m and cast_dtype(m, "rms_upcast") != torch.float32:
        return None, "RMSNorm input is cast to a dtype other than fp32"
    seen = ("rms_upcast" in m, cast_dtype(m, "rms_cast"), cast_dtype(m, "rms_downcast"))
    wdtype = None if weight is None else weight.dtype
    for form in ("composite", "diffusers"):
        if _rms_casts(form, x.dtype, wdtype) == seen:
            return form, None
    return None, "RMSNorm rounding steps match neither F.rms_norm nor diffusers' RMSNorm"


def _rms_casts(form: str, x: torch.dtype, w: Optional[torch.dtype]):
    """(upcast?, cast before the weight, cast after) that ``form``'s eager chain runs."""
    promote = torch.promote_types
    if form == "composite":
        up = x in HALF
        y = torch.float32 if up else x
        if w is not None:
            y = promote(y, w)
        return up, None, (x if y != x else None)
    y = promote(x, torch.float32)  # diffusers: x * rsqrt(fp32 variance)
    if w is None:
        return x != torch.float32, None, (x if y != x else None)
    return x != torch.float32, (w if w in HALF and y != w else None), None


def is_last_dim(dim: Any, ndim: int) -> bool:
    """``dim`` (an int, or a list of one) names the last of ``ndim`` dims."""
    if isinstance(dim, (list, tuple)):
        return len(dim) == 1 and is_last_dim(dim[0], ndim)
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


# --- structural predicates (for Arg checks and matcher.When) --------------------------------

def is_product(v: Any) -> bool:
    return is_call(v, (aten.mul.Tensor,))


def is_token_stream(v: Any) -> bool:
    """A transformer's residual stream: [B, S, D]."""
    t = tensor_meta(v)
    return t is not None and t.dim() == 3


def is_vector(v: Any) -> bool:
    """A 1-D tensor (a linear's bias)."""
    t = tensor_meta(v)
    return t is not None and t.dim() == 1


def is_multi_dim(v: Any) -> bool:
    t = tensor_meta(v)
    return t is not None and t.dim() > 1


def splits_heads(v: Any) -> bool:
    """``v`` is a projection split into heads: ``[..., H*D]`` viewed as ``[..., H, D]``
    (``unflatten``, ``view``), maybe transposed after that with ``head_dim`` kept last (SD3's
    ``view(B, -1, H, D).transpose(1, 2)``) or cast (AuraFlow's fp32 LayerNorm)."""
    node = v
    while (is_call(node, (aten.transpose.int, aten.permute.default)) and _keeps_last_dim(node)
           or is_call(node, (aten._to_copy.default,))):
        node = node.args[0]
    if not is_call(node, RESHAPES) or not isinstance(node.args[0], fx.Node):
        return False
    out, whole = tensor_meta(node), tensor_meta(node.args[0])
    return (out is not None and whole is not None and out.dim() == whole.dim() + 1
            and all(same_size(a, b) for a, b in zip(out.shape[:-2], whole.shape[:-1]))
            and same_size(out.shape[-2] * out.shape[-1], whole.shape[-1]))


def depends_on(node: Any, ancestor: Any, limit: int = 50_000) -> bool:
    """Whether ``ancestor`` is among the nodes ``node`` is computed from (looked for through at
    most ``limit`` nodes: False past that)."""
    if not isinstance(node, fx.Node) or not isinstance(ancestor, fx.Node):
        return False
    seen, stack = {node}, [node]
    while stack and len(seen) <= limit:
        for n in stack.pop().all_input_nodes:
            if n is ancestor:
                return True
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return False


def is_call(node: Any, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _keeps_last_dim(node: fx.Node) -> bool:
    ndim = tensor_meta(node).dim()
    if node.target == aten.transpose.int:
        return not any(is_last_dim(d, ndim) for d in node.args[1:3])
    return is_last_dim(node.args[1][-1], ndim)


def feeds_head_split(node: Any) -> bool:
    """Every user of ``node`` reshapes its last dim into heads, [..., H*D] -> [..., H, D], H > 1
    (a QK-norm across heads, before ``unflatten``: Wan), or is a RoPE over it (``sgdiff::rope``,
    the rope family's rewrite: elementwise per position, the shape kept) whose every user does
    (LTX-Video: the norm, the rotary embedding, then ``unflatten``)."""
    out = tensor_meta(node)
    if out is None or not isinstance(node, fx.Node) or not node.users:
        return False
    for user in node.users:
        if _is_rope_of(user, node, out):
            if not feeds_head_split(user):
                return False
            continue
        view = tensor_meta(user) if is_call(user, RESHAPES) else None
        if view is None or view.dim() != out.dim() + 1 or same_size(view.shape[-2], 1):
            return False
        if not (all(same_size(a, b) for a, b in zip(view.shape[:-2], out.shape[:-1]))
                and same_size(view.shape[-2] * view.shape[-1], out.shape[-1])):
            return False
    return True


def _is_rope_of(user: fx.Node, node: fx.Node, out: torch.Tensor) -> bool:
    """``user`` is sgdiff's RoPE of ``node`` (its rotated input), of ``node``'s shape."""
    from sgdiff.kernels import registry

    rotated = tensor_meta(user)
    return (is_call(user, (registry.op_def("rope").load(),)) and user.args[:1] == (node,)
            and rotated is not None and tuple(rotated.shape) == tuple(out.shape))


def norm_chain_reason(m: Match, norm_reason: Callable[[Match], Optional[str]]) -> Optional[str]:
    """What every chain rooted in a norm checks first: a floating-point input, and the norm's
    own conditions (``norm_reason(m)``)."""
    x = tensor_meta(m["x"])
    if x is None or not x.dtype.is_floating_point:
        return "input is not a floating-point tensor"
    return norm_reason(m)


def sdpa() -> Expr:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` without a mask or
    dropout, as ATen traces it: the fused kernel torch's selector picked (FlashAttention,
    memory-efficient, cuDNN; on the CPU its flash kernel), its output (item 0)."""
    common = dict(query=Arg("q"), key=Arg("k"), value=Arg("v"), dropout_p=Lit(0.0), is_causal=Arg("is_causal"),
                  scale=Arg("scale"))
    return AnyOf(
        getitem(Op(aten._scaled_dot_product_flash_attention.default, **common, name="sdpa"), 0),
        getitem(Op(aten._scaled_dot_product_efficient_attention.default, **common, attn_bias=Lit(None), name="sdpa"), 0),
        getitem(Op(aten._scaled_dot_product_cudnn_attention.default, **common, attn_bias=Lit(None), name="sdpa"), 0),
        getitem(Op(aten._scaled_dot_product_flash_attention_for_cpu.default, **common, attn_mask=Lit(None),
                   name="sdpa"), 0))


def heads_last_output(node: Any) -> bool:
    """A 16-bit ``[B, H, S, D]`` attention output in ``[B, S, H, D]`` memory order, as
    FlashAttention writes it (what the attention ops write)."""
    out = tensor_meta(node)
    if out is None or out.dim() != 4 or out.dtype not in HALF:
        return False
    b, h, s, d = out.shape
    want = (s * h * d, d, h * d, 1)
    return all(same_size(n, 1) or same_size(st, w) for n, st, w in zip(out.shape, out.stride(), want))


def sdpa_reason(m: Match) -> Optional[str]:
    """Why an attention site is not one the attention ops take (q, k, v ``[B, H, S, D]`` of one
    dtype, one head count and head dim, unit stride along it), or None."""
    q, k, v = (tensor_meta(m[n]) for n in ("q", "k", "v"))
    if q is None or k is None or v is None or not q.dim() == k.dim() == v.dim() == 4:
        return "q, k and v are not [B, H, S, D] tensors"
    if not q.dtype == k.dtype == v.dtype:
        return "q, k and v differ in dtype"
    if not (same_size(q.shape[1], k.shape[1]) and same_size(k.shape[1], v.shape[1])
            and same_size(q.shape[-1], k.shape[-1]) and same_size(k.shape[-1], v.shape[-1])
            and same_size(k.shape[2], v.shape[2])):
        return "q, k and v differ in head count or head dim (grouped-query attention)"
    if not all(same_size(t.stride(-1), 1) for t in (q, k, v)):
        return "q, k or v is strided along the head dim"
    return None


def sdpa_arguments(m: Match) -> dict:
    return dict(q=m["q"], k=m["k"], v=m["v"], is_causal=m["is_causal"], scale=m["scale"])
