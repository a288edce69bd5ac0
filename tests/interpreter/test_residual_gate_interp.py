"""residual_gate and residual_add (sgdiff/kernels/triton/residual_gate.py) under Triton's CPU
interpreter, against their references.

The interpreter computes fp32 like the GPU (fma, correctly rounded division): fp32 results are
exact. It truncates fp32 -> bf16, so bf16 results are compared with a tolerance (an ulp per
rounding) and exactness is claimed only on the GPU (tests/gpu). Run by
tests/test_triton_interpreter.py with TRITON_INTERPRET=1 (skipped without it).
"""
import itertools

import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.residual_add import residual_add_reference  # noqa: E402
from sgdiff.kernels.residual_gate import residual_gate_reference as ref  # noqa: E402
from sgdiff.kernels.triton import residual_gate as tk  # noqa: E402
from tests.interpreter.common import FP32_BF16, assert_within, drawn, ids  # noqa: E402

pytestmark = pytest.mark.interpreter

WIDTHS = (96, 1160)   # rows of one tile and of several column blocks, the last partial (1160: 10 of 128)
LAST = (torch.bfloat16, 1160)   # the inputs the script's checks after its loop took


def script_draws():
    """The former script's random inputs in its order (see tests.interpreter.common.drawn): for
    each dtype and width the residual r [2, 5, D], a gate g [2, 1, D], an update u (a chunk view)
    and a bias b."""
    torch.manual_seed(0)
    for dt, D in itertools.product(FP32_BF16, WIDTHS):
        r = torch.randn(2, 5, D, dtype=dt)
        g = torch.randn(2, 1, D, dtype=dt)
        u = torch.randn(2, 5, 2 * D, dtype=dt)[..., :D]  # a chunk view
        b = torch.randn(D, dtype=dt)
        yield (dt, D), (r, g, u, b)


def inputs(dt, D):
    return drawn(script_draws(), (dt, D))


# residual_gate's arguments: (residual, gate, update, gate_kind, residual_layout, update_bias,
# update_divisor, out_dtype)
GATE_ARGS = {
    "gate": lambda r, g, u, b: (r, g, u, "plain"),
    "gate_view": lambda r, g, u, b: (r, g[:, 0][:, None], u, "plain"),
    "one_batch": lambda r, g, u, b: (r[0], g[0, 0], u[0], "plain"),
    "fp32_stream": lambda r, g, u, b: (r.float(), g.float(), u, "plain"),   # Wan: fp32 stream, bf16 update
    "bias": lambda r, g, u, b: (r, g, u, "plain", True, b),                 # a linear's bias
    "fp32_bias": lambda r, g, u, b: (r, g, u, "plain", True, b.float()),
    "divisor": lambda r, g, u, b: (r, g, u, "plain", True, None, 3.0),      # / rescale_output_factor
    "bias_divisor": lambda r, g, u, b: (r, g, u, "plain", True, b, 0.7),
    "divisor_one": lambda r, g, u, b: (r, g, u, "plain", True, None, 1.0),  # ... of 1: no product (tk.scales)
    "type_as": lambda r, g, u, b: (r, g.float(), u, "plain", True, None, None, torch.bfloat16),  # Wan: (x.float() + y * g).type_as(x)
    # Mochi's product cast before the sum (to fp16 here: the interpreter rounds to it as the GPU does)
    "product_cast": lambda r, g, u, b: (r, g, u.float(), "plain", True, None, None, None, None, torch.float16),
}


@pytest.mark.parametrize("form", list(GATE_ARGS))
@pytest.mark.parametrize("D", WIDTHS)
@pytest.mark.parametrize("dt", FP32_BF16, ids=ids)
def test_residual_gate(dt, D, form):
    r, g, u, b = inputs(dt, D)
    args = GATE_ARGS[form](r, g, u, b)
    assert tk.supported_layout(*args)
    got, want = tk.residual_gate(*args), ref(*args)
    if len(args) == 7:   # CUDA divides by a CPU scalar as a product with its fp32 reciprocal
        ub = args[2] + args[5] if args[5] is not None else args[2]
        want = ref(r, g, (ub.float() * tk.reciprocal(args[6])).to(ub.dtype), "plain")
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:   # the interpreter's fp32 is the GPU's: exact
        assert torch.equal(got, want)
    else:                            # it truncates to bf16: an ulp per rounding
        assert_within(got, want, 2 ** -6)


# residual_add's arguments from r and u (LAST): (residual, update, update_divisor, update_first, update_scale)
ADD_ARGS = {
    "divisor": lambda r, u: (r, u.contiguous(), 3.0, True),   # ungated, rescaled
    "fp32_update": lambda r, u: (r, u.contiguous().float(), 0.7, False),
    "divisor_one": lambda r, u: (r, u.contiguous(), 1.0, False),
    "scale": lambda r, u: (r, u.contiguous(), None, False, 0.7),   # x + 0.7 * u: the fp32 number's product
    "fp32_scale": lambda r, u: (r.float(), u.contiguous().float(), None, True, 1 / 3),
    "scale_one": lambda r, u: (r, u.contiguous(), None, False, 1.0),
}


@pytest.mark.parametrize("form", list(ADD_ARGS))
def test_residual_add(form):
    r, g, u, b = inputs(*LAST)
    args = ADD_ARGS[form](r, u)
    assert tk.residual_add_supported_layout(*args)
    got, want = tk.residual_add(*args), residual_add_reference(*args)
    assert got.dtype == want.dtype
    if got.dtype == torch.float32 and len(args) == 5:   # a product by the number rounded to fp32: exact
        assert torch.equal(got, want)
    assert_within(got, want, 2 ** -6)


def test_tanh_gate():
    r, g, u, b = inputs(*LAST)
    got, want = tk.residual_gate(r, g, u, "tanh"), ref(r, g, u, "tanh")   # tanh gates (numpy's tanh)
    assert_within(got, want, 2 ** -6)


def test_refused_layouts():
    r, g, u, b = inputs(*LAST)
    assert not tk.residual_add_supported_layout(r, u, 3.0, True)   # a strided update: eager's layout may differ
    assert not tk.residual_add_supported_layout(r, u.contiguous(), 3.0, True, 0.5)   # a divisor and a scale
    assert not tk.residual_add_supported_layout(r, u.contiguous(), None, True)       # neither
    assert not tk.supported_layout(r[:, :1], g, u, "plain")            # broadcasts past the residual
    assert not tk.supported_layout(r[..., ::2], g[..., ::2], u[..., ::2], "plain")   # not dense
    transposed = r.transpose(1, 2).contiguous().transpose(1, 2)
    assert tk.supported_layout(transposed, g, u, "plain")
    assert not tk.supported_layout(transposed, g, u, "plain", False)   # a contiguous output from it: no
    assert not tk.residual_add_supported_layout(transposed, u.contiguous(), 3.0, True)   # laid out otherwise


# Sana's token stream: [B, C, S] memory read as [B, S, C] (the residual, and its update laid out
# alike or contiguous), a 2-D transposed residual, and a batch-outer permutation
MEMORY_ORDERS = {
    "channels_first": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    "batch_inner": lambda t: t.permute(1, 2, 0).contiguous().permute(2, 0, 1),
}


@pytest.mark.parametrize("update_alike", [True, False])
@pytest.mark.parametrize("order", list(MEMORY_ORDERS))
@pytest.mark.parametrize("gate_kind", ["plain", "tanh"])
def test_a_residual_in_another_memory_order(order, update_alike, gate_kind):
    """The kernel runs over the residual's memory order: the reference's values, in the
    residual's strides (what eager's TensorIterator gives a residual that comes first)."""
    torch.manual_seed(0)
    lay = MEMORY_ORDERS[order]
    r, u = lay(torch.randn(2, 37, 160)), torch.randn(2, 37, 160)
    u = lay(u) if update_alike else u
    g, b = torch.randn(2, 1, 160), torch.randn(160)
    for args in ((r, g, u, gate_kind), (r, g, u, gate_kind, True, b, 3.0)):
        assert tk.supported_layout(*args)
        got, want = tk.residual_gate(*args), ref(*args)
        if len(args) == 7:   # CUDA divides by a CPU scalar as a product with its fp32 reciprocal
            want = ref(r, g, ((u + b) * tk.reciprocal(3.0)), gate_kind)
        assert got.stride() == want.stride() == r.stride()
        if gate_kind == "tanh":   # the interpreter's tanh is numpy's
            assert_within(got, want, 2 ** -20)
        else:
            assert torch.equal(got, want)
    if update_alike:
        got = tk.residual_add(r, u, 3.0, False)
        assert got.stride() == r.stride()
        assert torch.equal(got, r + (u * tk.reciprocal(3.0)))


def test_a_transposed_2d_residual():
    torch.manual_seed(0)
    r, g, u = torch.randn(160, 37).t(), torch.randn(160), torch.randn(37, 160)
    got = tk.residual_gate(r, g, u, "plain")
    assert got.stride() == r.stride() and torch.equal(got, r + g * u)


@pytest.mark.parametrize("kind", ["plain", "tanh"])
def test_gate_addend_summed_in_the_kernel(kind):
    """Wan 2.2's per-token gate as the fp32 table view and the bf16 embedding view eager summed:
    the kernel's sum, then the gate function in the sum's dtype, then eager's product and sum."""
    torch.manual_seed(0)
    B, S, D = 2, 7, 256
    table, temb = torch.randn(1, 6, D), torch.randn(B, S, 6, D, dtype=torch.bfloat16)
    gate, gate_add = table.unsqueeze(0).expand(B, S, 6, D)[:, :, 2], temb[:, :, 2]
    residual, update = torch.randn(B, S, D, dtype=torch.bfloat16), torch.randn(B, S, D, dtype=torch.bfloat16)
    args = (residual, gate, update, kind, True, None, None, torch.bfloat16, gate_add)
    assert tk.supported_layout(*args)
    got, want = tk.residual_gate(*args), ref(*args)
    assert got.dtype == want.dtype == torch.bfloat16
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 2 ** -6 * max(1.0, want.float().abs().max().item()), err
    assert not tk.supported_layout(residual, None, update, "plain", True, None, None, None, gate_add)
