"""sgdiff::channel_normalize — ``F.normalize`` over the channels, scaled, a per-channel affine
and an optional SiLU: what follows the norm, in one pass.

Eager chain (diffusers' ``WanRMS_norm``, channel-first, in Wan's VAE; ``nn.SiLU`` after it in
every residual block and before the decoder's head)::

    n = F.normalize(x.float(), dim=1).to(x.dtype)   # norm over C (ATen's reduce), clamp_min(eps),
                                                    # expand, fp32 division, the cast back
    y = n * scale * gamma + bias                    # scale = sqrt(C); bias 0.0 or per channel
    y = F.silu(y)                                   # where the block has one

For an fp32 ``x`` there are no casts. Where one compiled frame serves norms of several widths
(a block's code called for each of a VAE's stages), dynamo makes ``self.scale`` an input of the
graph after its first recompile: the graph then multiplies by a 0-d fp32 tensor on the host
(``scale_tensor``), which rounds as the Python float does. Eager makes a pass for each step (the fp32 division over
an fp32 copy among them); the op takes ATen's norm, computed as eager computes it, and makes one.
Each step rounds as eager's kernel does (:mod:`sgdiff.kernels.triton.channel_normalize`). The
reference implementation *is* the chain.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten


def channel_normalize_reference(
    x: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    scale: float,
    gamma: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    bias_value: float = 0.0,
    silu: bool = False,
    scale_tensor: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    wide = x.dtype != torch.float32
    xf = aten._to_copy.default(x, dtype=torch.float32) if wide else x
    d = aten.div.Tensor(xf, aten.expand.default(aten.clamp_min.default(norm, eps), list(xf.shape)))
    y = aten._to_copy.default(d, dtype=x.dtype) if wide else d
    y = aten.mul.Tensor(aten.mul.Tensor(y, scale if scale_tensor is None else scale_tensor), gamma)
    y = aten.add.Tensor(y, bias if bias is not None else bias_value)
    return aten.silu.default(y) if silu else y


def _wan(t):
    """A Wan 2.1 VAE decoder feature map ``[1, C, T, H, W]`` (bf16 in the model), its norm over
    the channels as ``F.normalize`` computes it, a gamma of ones (its initial value) moved a little."""
    x = t.randn(1, t.C, t.T, t.H, t.W)
    norm = torch.linalg.vector_norm(x.float(), 2, [1], True)
    gamma = t.randn(t.C, 1, 1, 1, scale=0.1, shift=1.0)
    return x, norm, 1e-12, t.C ** 0.5, gamma, None, 0.0, True


def _wan_frame_major(t):
    """:func:`_wan` on the map a spatial upsampling leaves: ``[b, t, c, h, w]`` viewed as
    ``[b, c, t, h, w]`` (its norm, as eager computes it, in the same layout)."""
    x = t.randn(1, t.T, t.C, t.H, t.W).transpose(1, 2)
    norm = torch.linalg.vector_norm(x.float(), 2, [1], True)
    return x, norm, 1e-12, t.C ** 0.5, t.randn(t.C, 1, 1, 1, scale=0.1, shift=1.0), None, 0.0, True


def _wan_scale_input(t):
    """:func:`_wan` with the scale as a graph input: the 0-d fp32 host tensor dynamo makes of
    ``self.scale`` once a frame serves norms of several widths."""
    return (*_wan(t), torch.tensor(t.C ** 0.5, dtype=torch.float32))


def _chain(x, norm, eps, scale, gamma, bias, bias_value, silu, scale_tensor=None):
    def run():
        s = scale if scale_tensor is None else scale_tensor
        y = F.normalize(x.float(), dim=1).to(x.dtype) * s * gamma + (bias if bias is not None else bias_value)
        return F.silu(y) if silu else y
    return run


def _moved(args, out):
    """x read, the output written (the norm is a channel's worth smaller)."""
    return [args[0], out]


channel_normalize = dispatch.define_op(OpDef(
    "channel_normalize", Contract.BITEXACT, channel_normalize_reference, impls=(triton("channel_normalize"),),
    examples=(
        Example("Wan 2.1 VAE decoder, last stage: RMS norm + SiLU", dict(C=96, T=4, H=480, W=832), _wan,
                small=dict(C=4, T=2, H=6, W=10), chain=_chain, moved=_moved),
        Example("Wan 2.1 VAE decoder, first stage: RMS norm + SiLU", dict(C=384, T=1, H=60, W=104), _wan,
                small=dict(C=8, T=1, H=6, W=10), chain=_chain, moved=_moved),
        Example("Wan 2.1 VAE decoder after a spatial upsampling: RMS norm + SiLU of a frame-major map",
                dict(C=192, T=4, H=480, W=832), _wan_frame_major, small=dict(C=4, T=2, H=6, W=10), chain=_chain,
                moved=_moved),
        Example("Wan 2.1 VAE decoder, a frame serving several widths: the scale a graph input",
                dict(C=192, T=4, H=240, W=416), _wan_scale_input, small=dict(C=4, T=2, H=6, W=10), chain=_chain,
                moved=_moved),
    ),
    doc="silu?((F.normalize(x.float(), dim=1, eps).to(x.dtype) * scale * gamma + bias)), the norm given",
))
