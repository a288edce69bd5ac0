"""Family ``fp8_gemm``: large linear layers as FP8 GEMMs (``high`` tier only: an ``approx`` op).

``F.linear`` traces to ``view(x) -> addmm(bias, ., t(weight)) -> view`` (``mm`` without a
bias); the GEMM and the view to rows before it are the site::

    addmm(bias, x.view(-1, K), weight.t())    a bf16 linear layer    -> linear_fp8 (x, weight, bias)
    convolution(x, weight [N, K, 1, 1], bias)  a 1x1 convolution of a channels-last map (Sana's
                                               GLUMBConv)             -> pointwise_conv_fp8
    addmm(bias, gelu(x, "tanh").view(-1, K), weight.t()) (an eval-mode dropout's clone between them or
    not), or of cat([head, gelu(x, "tanh")], -1):
                                               a feed-forward's down projection, Flux single blocks'
                                               proj_out              -> gelu_linear_fp8 (x, weight, bias, head)

The last one's GELU and cat are read by nothing else: the op makes the GEMM's e4m3 rows in the
pass that computes the GELU, and neither the GELU's output nor the cat is ever written.

A site is a linear layer of at least :data:`MIN_FLOP` (smaller GEMMs gain less than the
activation's quantization pass costs: Wan's text embedder), or over a weight of at least
:data:`MIN_WEIGHT_BYTES` (a GEMM of few rows, an adaLN projection of the time embedding, takes
the time of reading its weight, and the e4m3 copy is half its bytes), whose K and N
are multiples of 16 (the FP8 GEMM's alignment), K at most 16384, and whose weight is a graph input (a parameter:
its e4m3 copy is made once and kept); other linear layers are not sites. On the GPU, each
site's signature runs the FP8 GEMM only where its first sight times it faster than the bf16 GEMM
(:func:`sgdiff.kernels.triton.linear_fp8.bind`). The op takes ``x``
before its view to rows (or the one view to rows they share, :mod:`sgdiff.fxpasses.views`), so
projections of one input (q, k and v) read one tensor, and the op quantizes it once for all of
them (:mod:`sgdiff.kernels.triton.linear_fp8`). A 1x1 convolution (stride 1, no padding, one
group) of a channels-last map is the same GEMM over the map's tokens; one over another layout is
not a site.

Runs before the activation family, whose ``linear_gelu_tanh`` (``close``) would otherwise take
the feed-forward's GEMM at ``high`` too.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import fx

from sgdiff.kernels.linear_fp8 import MAX_K
from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, same_size, tensor_meta
from sgdiff.patterns.gemm import _known
from sgdiff.patterns.matcher import AnyOf, Arg, Items, Lit, Match, Op, When

FAMILY = Family("fp8_gemm")

aten = torch.ops.aten

MIN_FLOP = 2 ** 33  # about 8.6 GFLOP: Flux's 512-row text projections (9.7) are sites, Wan's (2.4) are not
MIN_WEIGHT_BYTES = 2 ** 24  # 16 MiB: a GEMM of few rows over a weight this large reads mostly the weight
ALIGN = 16

_ROWS = AnyOf(Op(parts.RESHAPES, Arg("x"), Arg("rows")), Arg("x"))  # x viewed as rows, or x itself
_WEIGHT_T = Op(aten.t.default, Arg("weight"), shared=True)


def _linear(rows):
    return AnyOf(Op(aten.addmm.default, Arg("bias"), rows, _WEIGHT_T, beta=Lit(1), alpha=Lit(1)),
                 Op(aten.mm.default, rows, _WEIGHT_T))


LINEAR = _linear(_ROWS)


def _read_here(node) -> bool:
    """A bf16 value of at most 4 dims (the rows the kernel reads) that only the chain reads:
    elsewhere the GEMM is linear_fp8's, over the value as it is."""
    t = tensor_meta(node)
    return (isinstance(node, fx.Node) and len(node.users) == 1 and t is not None and t.dtype == torch.bfloat16
            and t.dim() <= 4)


def _cat_along_rows(node) -> bool:
    """A cat of bf16 tensors of one rank along the last dim, read only by the chain."""
    if not _read_here(node) or node.target is not aten.cat.default:
        return False
    dim, rank = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)), tensor_meta(node).dim()
    inputs = [tensor_meta(p) for p in node.args[0]]
    return dim in (-1, rank - 1) and all(t is not None and t.dtype == torch.bfloat16 and t.dim() == rank for t in inputs)


_GELU = When(Op(aten.gelu.default, Arg("x"), approximate=Lit("tanh"), name="gelu"), _read_here)
_GELU_IN = AnyOf(When(Op(aten.cat.default, Items(Arg("head"), _GELU), Arg("dim"), name="cat"), _cat_along_rows),
                 When(Op(aten.clone.default, _GELU), _read_here), _GELU)  # the clone: an eval-mode dropout
GELU_LINEAR = _linear(AnyOf(When(Op(parts.RESHAPES, _GELU_IN, Arg("rows")), _read_here), _GELU_IN))


def _site(node) -> bool:
    """A bf16 GEMM of at least MIN_FLOP, or over a weight of at least MIN_WEIGHT_BYTES (unknown
    sizes count as large), the weight a graph input, K and N multiples of 16, K at most the
    quantization kernel's MAX_K."""
    if not isinstance(node, fx.Node) or node.target not in (aten.addmm.default, aten.mm.default):
        return False
    weight_t = node.args[-1]
    weight = weight_t.args[0] if isinstance(weight_t, fx.Node) and weight_t.target is aten.t.default else None
    out, w = tensor_meta(node), tensor_meta(weight)
    if out is None or w is None or out.dtype != torch.bfloat16 or w.dim() != 2 or weight.op != "placeholder":
        return False
    n, k = (_known(s) for s in w.shape)
    if (n is not None and n % ALIGN) or (k is not None and (k % ALIGN or k > MAX_K)):
        return False
    m = _known(out.shape[0])
    return None in (m, n, k) or 2 * m * n * k >= MIN_FLOP or n * k * w.element_size() >= MIN_WEIGHT_BYTES


def _pointwise_site(node) -> bool:
    """A bf16 1x1 convolution of a channels-last map (:func:`parts.pointwise_convolution`), over a
    weight that is a graph input, of at least MIN_FLOP, C and N multiples of 16."""
    if not parts.pointwise_convolution(node):
        return False
    x, weight = node.args[0], node.args[1]
    xv, w = tensor_meta(x), tensor_meta(weight)
    if weight.op != "placeholder" or xv.dtype != torch.bfloat16:
        return False
    n, k = (_known(s) for s in w.shape[:2])
    if (n is not None and n % ALIGN) or (k is not None and (k % ALIGN or k > MAX_K)):
        return False
    m = _known(xv.numel() // xv.shape[1]) if _known(xv.shape[1]) else None
    return None in (m, n, k) or 2 * m * n * k >= MIN_FLOP


def _pointwise_reason(m: Match) -> Optional[str]:
    bias = tensor_meta(m.get("bias"))
    if m.get("bias") is not None and (bias is None or bias.dim() != 1 or bias.dtype != torch.bfloat16):
        return "the bias is not a 1-D bf16 tensor"
    if not tensor_meta(m["weight"]).is_contiguous():
        return "the weight is not contiguous"
    return None


def _reason(m: Match) -> Optional[str]:
    out, x, weight = tensor_meta(m.root), tensor_meta(m["x"]), tensor_meta(m["weight"])
    if x is None or x.dim() < 1 or x.dtype != torch.bfloat16 or not same_size(x.shape[-1], weight.shape[1]):
        return "not a bf16 linear layer over the input's last dim"
    if not same_size(x.numel(), out.shape[0] * weight.shape[1]):
        return "the GEMM's rows are not the input's leading dims flattened"
    if not x.is_contiguous():
        return "the linear's input is not contiguous (its rows are quantized where they lie)"
    return _bias_reason(m)


def _bias_reason(m: Match) -> Optional[str]:
    bias = tensor_meta(m.get("bias"))
    if m.get("bias") is not None and (bias is None or bias.dim() != 1 or bias.dtype != torch.bfloat16):
        return "the bias is not a 1-D tensor of the linear's dtype"
    return None


def _gelu_reason(m: Match) -> Optional[str]:
    """The GEMM's rows are ``[head | gelu(x)]``, read in any layout (the kernel reads x and head
    through their strides): only their sizes matter."""
    out, weight = tensor_meta(m.root), tensor_meta(m["weight"])
    a = tensor_meta(m["cat"] if "cat" in m else m["gelu"])
    if not same_size(a.shape[-1], weight.shape[1]) or not same_size(a.numel(), out.shape[0] * weight.shape[1]):
        return "the GEMM's rows are not the GELU's (or the cat's) leading dims flattened"
    return _bias_reason(m)


def _gelu_arguments(m: Match) -> dict:
    return dict(x=m["x"], weight=m["weight"], bias=m.get("bias"), head=m.get("head"))


POINTWISE_CONV = Op(aten.convolution.default, Arg("x"), Arg("weight"), Arg("bias"))


def _arguments(m: Match) -> dict:
    return dict(x=m["x"], weight=m["weight"], bias=m.get("bias"))


def patterns() -> List[ChainPattern]:
    return [ChainPattern(family="fp8_gemm", name="gelu_linear_fp8", chain=When(GELU_LINEAR, _site),
                         op="gelu_linear_fp8", replacement=_gelu_arguments, check=_gelu_reason, priority=1),
            ChainPattern(family="fp8_gemm", name="linear_fp8", chain=When(LINEAR, _site), op="linear_fp8",
                         replacement=_arguments, check=_reason),
            ChainPattern(family="fp8_gemm", name="pointwise_conv_fp8", chain=When(POINTWISE_CONV, _pointwise_site),
                         op="pointwise_conv_fp8", replacement=_arguments, check=_pointwise_reason)]
