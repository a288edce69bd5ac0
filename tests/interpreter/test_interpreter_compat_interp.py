"""tests/interpreter/interpreter_compat.py: the interpreter's builtins listed once give the
interpreter's own results, and every launch still leaves ``triton.language`` as it found it."""
import inspect

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

pytestmark = pytest.mark.interpreter


@triton.jit
def _twice(x):  # a helper: its call patches the language again, inside the kernel
    return x + x


@triton.jit
def _scaled(x, y):  # a helper calling a helper
    return _twice(x) / tl.maximum(tl.abs(y), 1e-3)


@triton.jit
def _kernel(x_ptr, y_ptr, out_ptr, SIZE: tl.constexpr):
    i = tl.arange(0, SIZE)
    x, y = tl.load(x_ptr + i), tl.load(y_ptr + i)
    tl.store(out_ptr + i, _scaled(x, y) + tl.sum(x, 0))


def test_builtins_listed_once_compute_as_the_interpreter_does():
    assert getattr(interpreter._patch_builtin, "lists_builtins_once", False)
    before = {name: member for name, member in inspect.getmembers(tl) if tl.core.is_builtin(member)}
    torch.manual_seed(0)
    x, y = torch.randn(64), torch.randn(64)
    out = torch.empty(64)
    _kernel[(1,)](x, y, out, SIZE=64)
    want = (x + x) / y.abs().clamp_min(1e-3) + x.sum()
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-5)
    after = {name: member for name, member in inspect.getmembers(tl) if tl.core.is_builtin(member)}
    assert after == before  # every builtin put back after the launch
