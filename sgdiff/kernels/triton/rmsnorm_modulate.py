"""Triton sgdiff::rmsnorm_modulate, bitwise equal to eager on CUDA: the RMSNorm kernel
(:mod:`.rms_norm`, either form), then the modulate kernel (:mod:`.modulate`) on its output.

Two launches instead of the chain's five to nine ATen ops. Each kernel keeps its chain's
roundings, and the norm's output is the tensor eager's modulation reads (its layout changes no
value of an elementwise chain). One fused pass would also save writing and reading the norm's
output; no model in the zoo runs this chain, so the composition stands until one does.
"""
from __future__ import annotations

from sgdiff.kernels.triton import modulate as tmod
from sgdiff.kernels.triton import rms_norm as trms


def supported_layout(x, weight, eps, form, scale, shift) -> bool:
    return trms.supported_layout(x, weight, eps, form) and tmod.supported_layout(x, scale, shift)


def can_use(x, weight, eps, form, scale, shift) -> bool:
    return x.is_cuda and supported_layout(x, weight, eps, form, scale, shift)


def rmsnorm_modulate(x, weight, eps, form, scale, shift):
    """Launch; the caller has checked :func:`can_use`."""
    return tmod.modulate(trms.rms_norm(x, weight, eps, form), scale, shift)


rmsnorm_modulate.can_use = can_use
