"""sgdiff::rms_norm — an RMSNorm over the last dim, in each of its eager forms.

``form`` names the eager chain the op reproduces (``w`` is the optional weight)::

    "composite"  F.rms_norm / torch.nn.RMSNorm where ATen decomposes it (CPU):
                     xf = x.float() if x is fp16/bf16 else x        # _to_copy
                     r  = rsqrt(mean(xf ** 2, -1, keepdim) + eps)   # pow, mean.dim, add.Scalar, rsqrt
                     y  = xf * r                                    # rounded to xf's dtype
                     y  = y * w                                     # promoted with w (fp32 * bf16 -> fp32)
                     y  = y.to(x.dtype)                             # after an upcast only
    "fused"      F.rms_norm where ATen runs one kernel (CUDA):
                     y = aten._fused_rms_norm(x, [D], w, eps)[0]
    "diffusers"  diffusers' hand-written RMSNorm:
                     r = rsqrt(x.to(float32).pow(2).mean(-1, keepdim=True) + eps)   # add.Tensor
                     y = x * r                                      # fp32: x's values are exact in fp32
                     with w: y = y.to(w.dtype) if w is fp16/bf16; y = y * w
                     without: y = y.to(x.dtype)

Each ``.to`` is a rounding step, and a no-op (absent from the graph) when the dtype already
matches. The output has ``x``'s layout (:mod:`sgdiff.kernels.layout`), as each chain leaves it.
The reference implementation below *is* the chain, op for op.
"""
from __future__ import annotations

from typing import Optional

import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.examples import Example
from sgdiff.kernels.layout import in_layout_of
from sgdiff.kernels.registry import OpDef, triton
from sgdiff.tiers import Contract

aten = torch.ops.aten

FORMS = ("composite", "fused", "diffusers")
HALF = (torch.float16, torch.bfloat16)


def to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``Tensor.to(dtype)``: a rounding ``_to_copy``, or ``t`` itself when the dtype matches."""
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def _inv_rms(xf: torch.Tensor, eps: float, add) -> torch.Tensor:
    return aten.rsqrt.default(add(aten.mean.dim(aten.pow.Tensor_Scalar(xf, 2), [-1], True), eps))


def _composite(x, weight, eps):
    xf = to(x, torch.float32) if x.dtype in HALF else x
    y = aten.mul.Tensor(xf, _inv_rms(xf, eps, aten.add.Scalar))
    del xf  # freed where the graph frees it: the allocator then reuses its memory
    if weight is not None:
        y = aten.mul.Tensor(y, weight)
    return to(y, x.dtype)


def _fused(x, weight, eps):
    return aten._fused_rms_norm.default(x, [x.shape[-1]], weight, eps)[0]


def _diffusers(x, weight, eps):
    y = aten.mul.Tensor(x, _inv_rms(to(x, torch.float32), eps, aten.add.Tensor))
    if weight is None:
        return to(y, x.dtype)
    if weight.dtype in HALF:
        y = to(y, weight.dtype)
    return aten.mul.Tensor(y, weight)


_CHAINS = {"composite": _composite, "fused": _fused, "diffusers": _diffusers}


def rms_norm_chain(x: torch.Tensor, weight: Optional[torch.Tensor], eps: Optional[float], form: str) -> torch.Tensor:
    """The eager chain of ``form``, as it leaves its output (shared with ``rmsnorm_modulate``)."""
    if form not in _CHAINS:
        raise ValueError(f"unknown RMSNorm form {form!r}; known: {', '.join(FORMS)}")
    if eps is None and form != "fused":
        raise ValueError(f"RMSNorm form {form!r} needs an eps")
    return _CHAINS[form](x, weight, eps)


def rms_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: Optional[float],
    form: str,
) -> torch.Tensor:
    return in_layout_of(rms_norm_chain(x, weight, eps, form), x)


def module_chain(x, weight, eps, form):
    """The norm as a model holds it: diffusers' ``RMSNorm`` (form ``diffusers``) or
    ``torch.nn.RMSNorm`` (``fused``: ``F.rms_norm``), with ``weight`` as its parameter."""
    if form == "diffusers":
        from diffusers.models.normalization import RMSNorm

        norm = RMSNorm(x.shape[-1], eps=eps, elementwise_affine=weight is not None)
    else:
        norm = torch.nn.RMSNorm(x.shape[-1], eps=eps, elementwise_affine=weight is not None)
    if weight is not None:
        norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return lambda: norm(x)


def _heads(form, transposed=False):
    def make(t):
        x = t.randn(t.B, t.S, t.H, t.D)
        return x.transpose(1, 2) if transposed else x, t.randn(t.D), 1e-6, form

    return make


rms_norm = dispatch.define_op(OpDef(
    "rms_norm", Contract.BITEXACT, rms_norm_reference, impls=(triton("rms_norm"),),
    examples=(
        Example("[B, S, H, D], diffusers form", dict(B=1, S=4608, H=24, D=128), _heads("diffusers"),
                small=dict(S=64, H=3), chain=module_chain),
        Example("[B, H, S, D] view (SD3.5-large), diffusers form", dict(B=2, S=4096, H=38, D=64),
                _heads("diffusers", transposed=True), small=dict(S=64, H=3), chain=module_chain),
        Example("Flux.1-dev q per head (F.rms_norm, fused)", dict(B=1, S=4608, H=24, D=128), _heads("fused"),
                small=dict(S=64, H=3), chain=module_chain),
        Example("Wan 2.1 1.3B q across heads (F.rms_norm, fused)", dict(B=1, S=32760, D=1536),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D), 1e-6, "fused"), chain=module_chain),
        Example("Wan 2.1 14B q across heads (F.rms_norm, fused)", dict(B=1, S=32760, D=5120),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D), 1e-6, "fused"), chain=module_chain),
        Example("diffusers rows of 2304, fp32 weight", dict(B=2, S=4352, D=2304),
                lambda t: (t.randn(t.B, t.S, t.D), t.randn(t.D, dtype=torch.float32), 1e-5, "diffusers"),
                bench=False),
    ),
    doc="RMSNorm over the last dim: F.rms_norm composite or fused, or diffusers' RMSNorm",
))
