"""Custom ops and their implementations.

Each op lives in its own module (``sgdiff.kernels.<op>``): the op's schema, its reference
implementation (the eager chain itself, also the oracle) and its fake implementation.
Accelerated implementations (Triton) live in ``sgdiff.kernels.triton`` and are described by
``KernelSpec`` entries in :mod:`sgdiff.kernels.registry`, which loads them only when used.

This package knows nothing of graphs or patterns; importing it imports no op module.
"""
