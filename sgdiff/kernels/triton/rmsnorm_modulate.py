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


def bind(x, weight, eps, form, scale, shift):
    """:func:`rmsnorm_modulate` for inputs of this signature: the RMSNorm's launch bound now,
    the modulation's at the first call, on the norm's output."""
    norm, modulate = trms.bind(x, weight, eps, form), None

    def launch(x, weight, eps, form, scale, shift):
        nonlocal modulate
        y = norm(x, weight)
        if modulate is None:
            modulate = tmod.bind(y, scale, shift)
        return modulate(y, scale, shift)

    return launch


def rmsnorm_modulate(x, weight, eps, form, scale, shift):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, eps, form, scale, shift)(x, weight, eps, form, scale, shift)


rmsnorm_modulate.can_use, rmsnorm_modulate.bind = can_use, bind
