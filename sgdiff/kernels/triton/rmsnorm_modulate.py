"""Triton sgdiff::rmsnorm_modulate, bitwise equal to eager on CUDA: the RMSNorm kernel
(:mod:`.rms_norm`, either form) with the modulation (:func:`.modulate.modulated`) applied to
each row before it is stored, in one pass: the norm's output never reaches memory. Each step
keeps its chain's rounding (the norm's output rounded to its dtype, ``1 + scale`` to scale's,
the product and the sum to their promoted dtypes); the output is contiguous, as the chain's.
"""
from __future__ import annotations

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton import modulate as tmod
from sgdiff.kernels.triton import rms_norm as trms


def supported_layout(x, weight, eps, form, scale, shift) -> bool:
    return trms.supported_layout(x, weight, eps, form) and tmod.supported_layout(x, scale, shift)


def can_use(x, weight, eps, form, scale, shift) -> bool:
    return x.is_cuda and supported_layout(x, weight, eps, form, scale, shift)


def bind(x, weight, eps, form, scale, shift):
    """:func:`rmsnorm_modulate` for inputs of this signature: the RMSNorm kernel's launch with
    the modulation compiled in."""
    return trms.bind(x, weight, eps, form, scale, shift)


def rmsnorm_modulate(x, weight, eps, form, scale, shift):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(x, weight, eps, form, scale, shift)(x, weight, eps, form, scale, shift)


RMSNORM_MODULATE = Impl(run=rmsnorm_modulate, supports=supported_layout, bind=bind)
