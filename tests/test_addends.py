"""fold_addends: a per-token adaLN's sum (``table + temb.float()``) read only as modulation
operands is summed by the ops themselves, never stored; every near miss keeps the sum; the
output is eager's bit for bit."""
import logging

import pytest
import torch
import torch.nn.functional as F

from sgdiff import zoo
from tests.capture import rewrite

aten = torch.ops.aten
B, S, D = 2, 10, 64


def sums(gm):
    """The [B, S, 6, D] adds left in the graph."""
    return sum(n.target is aten.add.Tensor and tuple(n.meta["val"].shape) == (B, S, 6, D) for n in gm.graph.nodes)


def addends_given(gm):
    ops = {torch.ops.sgdiff.layernorm_modulate.default: (9, 10), torch.ops.sgdiff.residual_gate.default: (8,)}
    return sum(1 for n in gm.graph.nodes if n.target in ops
               for i in ops[n.target] if i < len(n.args) and n.args[i] is not None)


def block(x, update, table, temb, spelling="wan"):
    """Wan 2.2's per-token modulation: six [B, S, D] slices of one fp32 sum, two LayerNorm-
    modulates and two gated residuals (the FFN's product written update-first, as diffusers)."""
    mods = table.unsqueeze(0) + temb.float()
    shift, scale, gate, c_shift, c_scale, c_gate = (m.squeeze(2) for m in mods.chunk(6, dim=2))
    if spelling == "read_elsewhere":
        x = x + mods.mean(2).to(x.dtype)
    if spelling == "copied":
        scale = scale.contiguous().clone()
    h = (F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + scale) + shift).type_as(x)
    x = (x.float() + (h + update).float() * gate).type_as(x)
    h = (F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + c_scale) + c_shift).type_as(x)
    return (x.float() + (h * 2 + update).float() * c_gate).type_as(x)


def inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, S, D, generator=g).to(dtype), torch.randn(B, S, D, generator=g).to(dtype),
            torch.randn(1, 6, D, generator=g), torch.randn(B, S, 6, D, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_sum_is_never_stored(dtype):
    args = inputs(dtype)
    run, gm, result = rewrite(block, args)
    # the two gated residuals, and `h * 2 + update`: a residual scaled by a number (residual_add)
    assert result.counts["modulate"] == 2 and result.counts["residual_gate"] == 3
    assert sums(gm) == 0 and addends_given(gm) == 6
    assert not any(n.target is aten._to_copy.default and tuple(n.meta["val"].shape) == (B, S, 6, D)
                   for n in gm.graph.nodes)  # the widened embedding went with it
    assert torch.equal(run(*args), block(*args))


@pytest.mark.parametrize("spelling", ["read_elsewhere", "copied"])
def test_a_sum_read_by_anything_else_is_kept(spelling):
    """The sum also reduced elsewhere, or one slice copied before the chain: it must exist, so
    no operand is given as addends (folding would save nothing)."""
    args = inputs()
    run, gm, _ = rewrite(lambda *a: block(*a, spelling=spelling), args)
    assert sums(gm) == 1 and addends_given(gm) == 0
    assert torch.equal(run(*args), block(*args, spelling=spelling))


def test_a_bf16_sum_is_summed_and_rounded_as_eager():
    """Both tensors bf16: eager's sum is rounded to bf16 before the chain; the op's too."""
    x, update, table, temb = inputs()

    def fn(x, update, table, temb):
        mods = table.unsqueeze(0) + temb
        shift, scale = (m.squeeze(2) for m in mods.chunk(2, dim=2))
        return F.layer_norm(x, (D,), eps=1e-6) * (1 + scale) + shift

    args = (x, update, table.to(torch.bfloat16)[:, :2], temb[:, :, :2])
    run, gm, _ = rewrite(fn, args)
    assert addends_given(gm) == 2
    assert torch.equal(run(*args), fn(*args))


def test_symbolic_sizes_keep_the_sum():
    args = inputs()
    run, gm, _ = rewrite(block, args, dynamic=True)
    assert addends_given(gm) == 0
    assert torch.equal(run(*args), block(*args))


def test_gate_is_the_conditioning_whatever_the_product_order():
    """``update * gate`` and ``gate * update`` with a per-token gate: the op's gate is the
    operand not computed from the residual, in both spellings."""
    x, update, table, temb = inputs()
    gate = table[:, 2:3] + temb[:, :, 2].float()

    for fn in (lambda x, u, g: (x.float() + (u + x).float() * g).type_as(x),
               lambda x, u, g: (x.float() + g * (u + x).float()).type_as(x)):
        run, gm, result = rewrite(fn, (x, update, gate), families=["residual_gate"])
        op, = [n for n in gm.graph.nodes if n.target is torch.ops.sgdiff.residual_gate.default]
        assert op.args[1].op == "placeholder" and result.counts["residual_gate"] == 1
        assert torch.equal(run(x, update, gate), fn(x, update, gate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_with_a_timestep_per_token(dtype, caplog):
    """diffusers' WanTransformer3DModel with a timestep per token (Wan 2.2 TI2V): the block's
    sum and the output norm's are summed by the ops; the output is eager's."""
    model, kwargs = zoo.build("wan", "tiny", dtype=dtype)
    tokens = kwargs["hidden_states"][0, 0].numel() // 4  # frames x (h / 2) x (w / 2)
    kwargs = dict(kwargs, timestep=torch.tensor([[500.0] * (tokens // 2) + [900.0] * (tokens - tokens // 2)]))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sgdiff"):
        want = model(**kwargs)[0]
        torch._dynamo.reset()
        got = torch.compile(model, backend="sgdiff", options={"cudagraphs": False})(**kwargs)[0]
    assert torch.equal(got, want)
    assert "2 sums read only as modulation operands are summed by their ops" in caplog.text
