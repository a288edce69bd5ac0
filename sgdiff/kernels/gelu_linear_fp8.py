"""sgdiff::gelu_linear_fp8 — a linear layer over a GELU (and a cat before it) as an FP8 GEMM
whose rows are quantized as the GELU makes them (the ``high`` tier).

Eager chain it stands for, in bf16 (a feed-forward's down projection; Flux single blocks'
``proj_out(cat([attn_output, act_mlp(proj_mlp(x))], dim=2))``)::

    g = gelu(x, approximate="tanh")          # rounded to x.dtype
    a = cat([head, g], -1)                   # or g alone, without head
    y = a.view(-1, K) @ weight.T + bias      # [M, N]

This op is that chain with its GELU in another form, followed by
:mod:`sgdiff.kernels.linear_fp8`'s GEMM of ``a``: each row of ``a`` scaled to e4m3's range and
rounded, the e4m3 product with the weight's e4m3 copy accumulated (as linear_fp8's), the scales
and bias applied, one rounding to bf16. The GELU is the same function, ``0.5 x (1 + tanh(u)) =
x sigma(2u)``, computed as ``x / (1 + 2^(-2 u log2 e))`` (:func:`gelu_tanh_fast`): one exponential
and one reciprocal where CUDA's ``tanhf`` computes an exponential, a reciprocal, a polynomial and
selects between them, so that the pass is bound by its bytes rather than its arithmetic. The two
forms differ by about 2^-22 relative in fp32, by one bf16 rounding at rare values, and e4m3's
2^-4 hides that. Its reference is ``linear_fp8_reference`` of ``a`` so made. The kernel makes
``a``'s e4m3 rows in one pass over ``x`` and ``head``: neither the GELU's output nor the cat is
written, nor read back to be quantized. Contract ``approx``, as linear_fp8's.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.linear_fp8 import fp8_impls, linear_fp8_reference
from sgdiff.kernels.registry import OpDef
from sgdiff.tiers import Contract

aten = torch.ops.aten


def gelu_input(x: torch.Tensor, head: Optional[torch.Tensor]) -> torch.Tensor:
    """The GEMM's input as eager makes it: ``gelu(x, "tanh")``, after ``head`` along the last dim."""
    return _after(head, aten.gelu.default(x, approximate="tanh"))


def _after(head: Optional[torch.Tensor], g: torch.Tensor) -> torch.Tensor:
    """``g`` after ``head`` along the last dim (``g`` itself without a head)."""
    return g if head is None else aten.cat.default([head, g], -1)


#: ``-2 log2(e) sqrt(2 / pi)``: the exponent of ``2^(-2u log2 e)`` is this times ``x + 0.044715 x^3``
NEG_2_LOG2E_BETA = -2.0 * math.log2(math.e) * math.sqrt(2.0 / math.pi)
KAPPA = 0.044715


def gelu_tanh_fast(x: torch.Tensor) -> torch.Tensor:
    """GELU-tanh as the op's pass computes it, in fp32, rounded to ``x.dtype``: ``t = c (x +
    0.044715 x^3)`` with ``c = -2 log2(e) sqrt(2 / pi)`` (so ``t = -2u log2 e``, u ATen's tanh
    argument), then ``x * (1 / (1 + 2^t))``. The kernel takes the cube's sum as one FMA, as ATen
    does, and the hardware's approximate ``ex2`` and reciprocal (about 2^-22 relative each)."""
    xf = x.float()
    t = xf.new_tensor(NEG_2_LOG2E_BETA) * torch.addcmul(xf, (xf * xf) * xf, xf.new_tensor(KAPPA))
    return (xf * torch.reciprocal(1.0 + torch.exp2(t))).to(x.dtype)


def fast_gelu_input(x: torch.Tensor, head: Optional[torch.Tensor]) -> torch.Tensor:
    """The GEMM's input as the op makes it before quantizing: :func:`gelu_tanh_fast` of ``x``,
    after ``head`` along the last dim."""
    return _after(head, gelu_tanh_fast(x))


def gelu_linear_fp8_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                              head: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[M, N]``, the rows ``M`` the leading dims of ``x`` flattened (the GEMM's, as ``addmm``
    gives it)."""
    return linear_fp8_reference(fast_gelu_input(x, head), weight, bias)


def _feed_forward_down(t):
    """A feed-forward's up projection (its GELU's input) and its down projection."""
    return t.randn(t.M, t.F, scale=2), t.randn(t.N, t.F, scale=t.F ** -0.5), t.randn(t.N, scale=0.1)


def _single_block_out(t):
    """Flux single blocks: the MLP's projection, proj_out's weight and bias, and SDPA's output
    laid out ``[B, S, H D]`` (a view), the cat's head."""
    head = t.randn(1, t.H, t.S, t.D).transpose(1, 2).flatten(2, 3)
    k = t.H * t.D + t.F
    return t.randn(1, t.S, t.F, scale=2), t.randn(t.N, k, scale=k ** -0.5), t.randn(t.N, scale=0.1), head


def _bf16_chain(x, weight, bias, head=None):
    """The eager chain: ATen's GELU, the cat, cuBLAS's bf16 GEMM."""
    return lambda: F.linear(gelu_input(x, head), weight, bias)


gelu_linear_fp8 = dispatch.define_op(OpDef(
    "gelu_linear_fp8", Contract.APPROX, gelu_linear_fp8_reference,
    impls=fp8_impls("cublas", "GELU_LINEAR_BF16", module="gelu_linear_fp8"),
    examples=(
        Example("Flux.1-dev double block, feed-forward down", dict(M=4096, F=12288, N=3072), _feed_forward_down,
                small=dict(M=64, F=256, N=64), chain=_bf16_chain),
        Example("Flux.1-dev single block, proj_out", dict(S=4608, H=24, D=128, F=12288, N=3072), _single_block_out,
                small=dict(S=64, H=2, D=64, F=256, N=96), chain=_bf16_chain),
        Example("Wan 2.1 1.3B feed-forward down", dict(M=32760, F=8960, N=1536), _feed_forward_down,
                small=dict(M=80, F=160, N=32), chain=_bf16_chain),
    ),
    doc="linear_fp8(cat([head, gelu(x, approximate='tanh')], -1), weight, bias) (head optional): the GELU as "
        "x / (1 + 2^(-2u log2 e)) (ATen's tanh form's function; one bf16 rounding apart at rare values), the cat, "
        "their rows quantized to e4m3 in the same pass, never written in bf16",
    caches_inputs=True,
))
