"""Family ``group_norm``: GroupNorm, and the SiLU after it (VAE decoders and encoders).

The eager chains::

    native_group_norm(x, weight, bias, N, C, HxW, G, eps)[0]          -> group_norm
    silu(native_group_norm(...)[0]), the norm read by the SiLU alone  -> group_norm (silu=True)
    either, of convolution(x, w, b) read by the norm alone             -> conv_group_norm

``F.group_norm`` (``nn.GroupNorm``) traces to ``aten.native_group_norm`` of its input made
contiguous; diffusers' ``ResnetBlock2D`` follows it with ``nn.SiLU`` (its ``norm1`` and
``norm2``), its attention's ``group_norm`` and the decoder's ``conv_norm_out`` too.
A norm without an affine is not a site (ATen computes it by another formula). Where the norm
reads a biased convolution (the ResNet block's ``conv1`` before ``norm2``), the convolution joins
the op, whose kernels add its bias as they read (ATen adds it in a pass of its own on cuDNN).
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import fx

from sgdiff.patterns import parts
from sgdiff.patterns.base import ChainPattern, Family, tensor_meta
from sgdiff.patterns.matcher import Arg, Match, Op, getitem

# on by default: bitwise equal to ATen's GroupNorm on the H200 (tests/gpu/test_group_norm_gpu.py) and
# a Flux VAE decode at 1024² in 0.6x eager's time (bench/results/small_models.md)
FAMILY = Family("group_norm")

aten = torch.ops.aten


def _norm(x=None) -> Op:
    return getitem(Op(aten.native_group_norm.default, x or Arg("x"), Arg("weight"), Arg("bias"), Arg("N"), Arg("C"),
                      Arg("HxW"), Arg("groups"), Arg("eps", check=parts.is_number), name="gn"), 0)


def _conv_norm() -> Op:
    return _norm(parts.biased_convolution(**parts.CONV_NAMES))


def _reason(m: Match) -> Optional[str]:
    if "conv" in m:
        reason = parts.convolution_reason(m, "conv_x", "conv_weight", "conv_bias")
        if reason:
            return reason
    x, out = tensor_meta(m["conv"] if "conv" in m else m["x"]), tensor_meta(m.root)
    if x is None or out is None or x.dim() < 3 or not x.dtype.is_floating_point:
        return "not a norm of a floating-point [N, C, *spatial] tensor"
    if not (isinstance(m["weight"], fx.Node) and isinstance(m["bias"], fx.Node)):
        return "a GroupNorm without its affine weight and bias"
    weight, bias = tensor_meta(m["weight"]), tensor_meta(m["bias"])
    if weight is None or bias is None or not weight.dtype == bias.dtype == x.dtype:
        return "the affine's dtype is not the input's"
    if not isinstance(m["groups"], int):
        return "a symbolic number of groups"
    return None


def patterns() -> List[ChainPattern]:
    norm = lambda m: dict(weight=m["weight"], bias=m["bias"], groups=m["groups"], eps=m["eps"])  # noqa: E731
    args = lambda m: dict(norm(m), x=m["x"])  # noqa: E731
    conv_args = lambda m: dict(norm(m), **parts.convolution_args(m))  # noqa: E731
    return [
        ChainPattern(family="group_norm", name="conv_group_norm_silu", chain=Op(aten.silu.default, _conv_norm()),
                     op="conv_group_norm", replacement=lambda m: dict(conv_args(m), silu=True), check=_reason,
                     priority=3),
        ChainPattern(family="group_norm", name="conv_group_norm", chain=_conv_norm(), op="conv_group_norm",
                     replacement=conv_args, check=_reason, priority=2),
        ChainPattern(family="group_norm", name="group_norm_silu", chain=Op(aten.silu.default, _norm()),
                     op="group_norm", replacement=lambda m: dict(args(m), silu=True), check=_reason, priority=1),
        ChainPattern(family="group_norm", name="group_norm", chain=_norm(), op="group_norm", replacement=args,
                     check=_reason),
    ]
