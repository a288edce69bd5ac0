"""sgdiff::group_norm — a GroupNorm with its affine, and the SiLU after it where there is one.

Eager chain (the VAE decoders' ResNet blocks and mid-block attention: ``nn.GroupNorm`` then
``nn.SiLU``)::

    y = F.group_norm(x, G, weight, bias, eps)   # aten.native_group_norm: per (sample, group)
                                                # Welford mean and variance, then
                                                # y = a * x + b per channel, rounded once
    y = F.silu(y)                               # (silu=True) rounded to x's dtype again

The reference implementation is that chain (``native_group_norm``'s first output, then the SiLU).
``channels_last``: the same values written channels-last, for convolutions that read them
(:mod:`sgdiff.fxpasses.layouts`); the reference copies, the kernel writes them so at no cost.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import as_channels_last, channels_last_format
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def group_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    groups: int,
    eps: float,
    silu: bool = False,
    channels_last: bool = False,
) -> torch.Tensor:
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // max(n * c, 1)
    y = aten.native_group_norm.default(_as_cpu_kernel_takes(x), weight, bias, n, c, hw, groups, eps)[0]
    y = aten.silu.default(y) if silu else y
    return as_channels_last(y) if channels_last else y


def _as_cpu_kernel_takes(x: torch.Tensor) -> torch.Tensor:
    """``x``, or on the CPU a contiguous copy where ATen's kernel would refuse its layout.

    ``F.group_norm`` hands the kernel ``input.contiguous(suggested format)``; a capture drops that
    copy where the fake tensor's strides say it changes nothing, and on the CPU they can be wrong
    (an add of a transposed attention output and a contiguous map, N = 1: the fake output is
    contiguous, the real one a channels-last view with a short batch stride, which the CPU
    kernel refuses). The copy is what the composite would have made; on CUDA the kernel reads any
    layout as eager's does."""
    if not x.is_cpu or x.is_contiguous():
        return x
    last = channels_last_format(x.dim())
    if last is not None and x.is_contiguous(memory_format=last) and x.stride(0) == x[0].numel():
        return x
    return x.contiguous()


def _vae_feature_map(t):
    """A decoder's feature map [B, C, H, W] and its GroupNorm's affine (32 groups)."""
    return (t.randn(t.B, t.C, t.H, t.W), t.randn(t.C, scale=0.5) + 1, t.randn(t.C, scale=0.1), 32, 1e-6, True)


def _for_a_convolution(t):
    """:func:`_vae_feature_map`, the output written channels-last for the convolution after it."""
    return (*_vae_feature_map(t), True)


group_norm = dispatch.define_op(OpDef(
    "group_norm", Contract.BITEXACT, group_norm_reference, impls=(triton("group_norm"),),
    examples=(
        Example("Flux VAE decoder, last up block: GroupNorm + SiLU at 1024²", dict(B=1, C=128, H=1024, W=1024),
                _vae_feature_map, small=dict(C=32, H=16, W=32),
                chain=lambda x, w, b, g, eps, silu: lambda: F.silu(F.group_norm(x, g, w, b, eps))),
        Example("Flux VAE decoder, mid block: GroupNorm + SiLU at 128²", dict(B=1, C=512, H=128, W=128),
                _vae_feature_map, small=dict(C=64, H=8, W=8),
                chain=lambda x, w, b, g, eps, silu: lambda: F.silu(F.group_norm(x, g, w, b, eps))),
        Example("Flux VAE decoder, last up block: GroupNorm + SiLU at 1024², written channels-last",
                dict(B=1, C=128, H=1024, W=1024), _for_a_convolution, small=dict(C=96, H=6, W=10),
                chain=lambda x, w, b, g, eps, silu, _: lambda: F.silu(F.group_norm(x, g, w, b, eps))),
    ),
    doc="silu?(native_group_norm(x, weight, bias, groups, eps)[0])",
))
