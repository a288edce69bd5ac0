"""Implementations written in NVIDIA's CuTe DSL (``nvidia-cutlass-dsl``), through quack's Hopper
GEMM (``quack-kernels``), both imported on first use: without them these implementations drop
out. Compiled for the GPU that runs them (``CUTE_DSL_ARCH``/``QUACK_ARCH`` name one where none
is present: the tests compile for sm_90a on a CPU).
"""
