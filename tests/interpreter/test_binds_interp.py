"""Every Triton implementation's bind, on its op's smallest example at its small sizes: a launch
bound to one signature, called again with other tensors of that geometry, gives what the
implementation's own call gives on them (it reads the call's tensors, not the bind's, and
writes a fresh output each call). The convolution epilogues bind on a convolution's output on
the GPU only (whether cuDNN runs it): their own tests in tests/interpreter/test_rowwise_interp.py,
test_group_norm_interp.py, test_conv_residual_interp.py and test_upsample_interp.py. A bound launch also holds no tensor of the call that bound it: a site keeps its launch as long as
its graph lives, so a tensor it held would stay allocated (a Wan 2.1 step held its 61 LayerNorm
inputs, 5.7 GiB, that way)."""
import gc
import weakref

import pytest
import torch

from sgdiff.kernels import registry

pytestmark = pytest.mark.interpreter
EPILOGUES = ("conv_silu", "conv_silu_mul", "conv_group_norm", "conv_residual", "biased_conv")
CAP, TOKENS = 128, 24  # sizes at most 128, 24 tokens: the interpreter runs each program on the host


def _ops():
    return [op.name for op in registry.ops() if op.name not in EPILOGUES
            and any(s.backend == "triton" for s in registry.kernel_specs(op.name))]


def _smallest_example(op):
    """The op's example whose small arguments hold the fewest values (the interpreter's time goes
    with them: GroupNorm's first example, 512-value groups, took 41 s a launch, its second 4)."""
    def size(example):
        args = example.args(small=True, seed=0, cap=CAP, tokens=TOKENS)
        return sum(a.numel() for a in args if isinstance(a, torch.Tensor))

    return min(registry.op_def(op).examples, key=size)


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("op", _ops())
def test_a_bound_launch_reads_each_calls_tensors(op):
    impl = registry.op_def(op).triton_impl()
    example = _smallest_example(op)
    first, other = (example.args(small=True, seed=seed, cap=CAP, tokens=TOKENS) for seed in (0, 1))
    assert impl.supports is None or impl.supports(*first)
    launch = impl.bind(*first)
    a, b = launch(*other), launch(*other)
    assert a.data_ptr() != b.data_ptr()
    assert torch.equal(_bits(a), _bits(impl.run(*other)))
    assert torch.equal(_bits(launch(*first)), _bits(impl.run(*first)))


@pytest.mark.parametrize("op", _ops())
def test_a_bound_launch_holds_no_tensor_of_the_call_that_bound_it(op, monkeypatch):
    from sgdiff.kernels.triton import layer_norm, layernorm_modulate

    def both(bind_gluon, bind_triton, what):  # as on a GPU: both binds kept until the first launch
        kernel = bind_triton()
        return lambda *args: (bind_gluon, kernel(*args))[1]

    for module in (layernorm_modulate, layer_norm):
        monkeypatch.setattr(module, "_gluon_or_triton", both)
    impl = registry.op_def(op).triton_impl()
    first = _smallest_example(op).args(small=True, seed=0, cap=CAP, tokens=TOKENS)
    held = [weakref.ref(a) for a in first if isinstance(a, torch.Tensor)]
    launch = impl.bind(*first)
    del first
    gc.collect()
    assert launch is not None and all(ref() is None for ref in held)


def test_every_triton_op_is_bound_here():
    assert len(_ops()) >= 18
