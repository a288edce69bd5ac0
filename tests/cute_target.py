"""Compile CuTe DSL kernels for Hopper where no GPU is present. CuTe DSL reads its target and
whether to keep the PTX when it is first imported, so every test module that compiles CuTe
kernels (the GEMM's, FlashAttention-4's) imports this before anything imports CuTe DSL: one
setting for the whole process, whichever module comes first."""
import os
import tempfile

import torch

COMPILE_ONLY = not torch.cuda.is_available()  # no GPU: kernels are compiled, never run

if COMPILE_ONLY:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # compile for Hopper, keep the PTX
    os.environ.setdefault("QUACK_ARCH", "90")
    os.environ.setdefault("CUTE_DSL_KEEP", "ptx")
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="sgdiff-cute-ptx-"))
    os.environ.setdefault("QUACK_CACHE_ENABLED", "0")  # compile rather than load a cached kernel
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")  # an H100's (the persistent grid's size)
