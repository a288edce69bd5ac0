"""The private torch APIs sgdiff relies on, in one place.

They drift between torch releases (the GPU box runs 2.11, CI 2.13): keep every use here.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
if TORCH_VERSION < (2, 6):
    raise ImportError(f"sgdiff needs torch >= 2.6, found {torch.__version__}")

from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402


def aot_capture(compiler: Callable, bw_compiler: Optional[Callable] = None) -> Callable:
    """A dynamo backend that captures the functionalized ATen graph with **no decompositions**
    (so the graph's eager execution is bitwise equal to the model's) and hands it to
    ``compiler(gm, example_inputs)``, which returns a boxed callable."""
    return aot_autograd(
        fw_compiler=compiler,
        inference_compiler=compiler,
        bw_compiler=bw_compiler or boxed_eager,
        decompositions={},
        keep_inference_input_mutations=True,
    )


def boxed_eager(gm: torch.fx.GraphModule, example_inputs) -> Callable:
    return make_boxed_func(gm.forward)


def boxed(fn: Callable) -> Callable:
    return make_boxed_func(fn)


def reset_dynamo() -> None:
    torch._dynamo.reset()


def fake_mode_of(tensors: Iterable[torch.Tensor]):
    """The FakeTensorMode the tensors share, None if none or if they disagree."""
    from torch._guards import detect_fake_mode

    try:
        return detect_fake_mode(list(tensors))
    except AssertionError:
        return None


def addmm_gelu_tanh(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(bias + mat1 @ mat2)``: cuBLASLt's GELU_BIAS epilogue on CUDA where it applies,
    else ``addmm`` then ``gelu_(approximate="tanh")`` (ATen's ``_addmm_activation``)."""
    return torch._addmm_activation(bias, mat1, mat2, use_gelu=True)
