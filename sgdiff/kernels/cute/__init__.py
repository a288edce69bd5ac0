"""Implementations written in NVIDIA's CuTe DSL (``nvidia-cutlass-dsl``), through quack's Hopper
GEMM (``quack-kernels``), both imported on first use: without them these implementations drop
out. Compiled for the GPU that runs them (``CUTE_DSL_ARCH``/``QUACK_ARCH`` name one where none
is present: the tests compile for sm_90a on a CPU).
"""
import functools
import importlib
import logging

import torch

log = logging.getLogger("sgdiff")


@functools.lru_cache(maxsize=None)
def _loads() -> bool:
    try:
        importlib.import_module("sgdiff.kernels.cute.gemm")  # the CuTe DSL, quack
    except Exception as exc:  # not installed, or a broken install: the other implementations serve
        log.info("sgdiff: the CuTe DSL GEMM is not available (%s: %s)", type(exc).__name__, exc)
        return False
    return True


def runs_on(device) -> bool:
    """Whether these implementations run on ``device``: a compute capability 9.x GPU, with the
    CuTe DSL and quack importable."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] == 9 and _loads()
