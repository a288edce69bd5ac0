"""Projections of one input as one FP8 GEMM (``linear_fp8_siblings``, high) on the CPU: which
linear_fp8 ops merge (one input, biases all given or all absent), the columns each projection's
users read, groups left alone where a value derived from a column cannot be made, the output
equal to the unmerged ops' math, the weights' side-by-side copy remade when one changes. (The
GEMM on the GPU: tests/gpu/test_fp8_gpu.py.)"""
import pytest
import torch
import torch.nn.functional as F

from sgdiff.kernels import registry
from sgdiff.kernels.linear_fp8 import linear_fp8_reference
from sgdiff.kernels.linear_fp8_siblings import linear_fp8_siblings_reference
from sgdiff.patterns import fp8_gemm
from tests.capture import rewrite
from tests.helpers import count_op

BF16 = torch.bfloat16
LINEAR_FP8 = torch.ops.sgdiff.linear_fp8.default
SIBLINGS = torch.ops.sgdiff.linear_fp8_siblings.default
SLICE = torch.ops.aten.slice.Tensor


@pytest.fixture(autouse=True)
def every_size(monkeypatch):
    """Small test shapes count as large GEMMs."""
    monkeypatch.setattr(fp8_gemm, "MIN_FLOP", 0)


def _w(n, k=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k ** 0.5).to(BF16)


def _b(n, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + 100)).to(BF16)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7)).to(BF16)


def _heads(y, h=4):
    """A projection's output viewed as heads, the way attention processors unflatten it."""
    return y.unflatten(-1, (h, -1))


def test_q_k_v_of_one_input_are_one_gemm_and_each_reads_its_columns():
    def attention_inputs(x, wq, bq, wk, bk, wv, bv):
        q, k, v = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
        return _heads(q) * 2, _heads(k).transpose(1, 2) + 1, v

    args = (_x(2, 64, 128), _w(128, seed=1), _b(128, 1), _w(128, seed=2), _b(128, 2), _w(64, seed=3), _b(64, 3))
    run, gm, result = rewrite(attention_inputs, args, quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 3 and result.merged_projections == 1
    assert count_op(gm, SIBLINGS) == 1 and count_op(gm, LINEAR_FP8) == 0
    (merged,) = [n for n in gm.graph.nodes if n.target is SIBLINGS]
    assert [(n.args[2], n.args[3]) for n in merged.users] == [(0, 128), (128, 256), (256, 320)]
    assert all(n.target is SLICE and n.meta["val"].stride() == (320, 1) for n in merged.users)
    x, (wq, bq, wk, bk, wv, bv) = args[0], args[1:]
    q, k, v = (linear_fp8_reference(x, w, b).view(2, 64, -1) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    got = run(*args)
    assert torch.equal(got[0], _heads(q) * 2) and torch.equal(got[1], _heads(k).transpose(1, 2) + 1)
    assert torch.equal(got[2], v)


def test_projections_with_and_without_a_bias_merge_apart_and_a_lone_one_stays():
    def projections(x, y, w1, b1, w2, b2, w3, w4, w5):
        return F.linear(x, w1, b1), F.linear(x, w2, b2), F.linear(x, w3), F.linear(x, w4), F.linear(y, w5)

    x, y = _x(64, 128), _x(64, 128) + 1
    args = (x, y, _w(64, seed=1), _b(64, 1), _w(32, seed=2), _b(32, 2), _w(48, seed=3), _w(16, seed=4), _w(64, seed=5))
    run, gm, result = rewrite(projections, args, quality="high", families=["fp8_gemm"])
    assert result.counts["fp8_gemm"] == 5 and result.merged_projections == 2
    assert count_op(gm, SIBLINGS) == 2 and count_op(gm, LINEAR_FP8) == 1
    groups = sorted((len(n.args[1]), len(n.args[2])) for n in gm.graph.nodes if n.target is SIBLINGS)
    assert groups == [(2, 0), (2, 2)]
    want = [linear_fp8_reference(x, *args[2:4]), linear_fp8_reference(x, *args[4:6]),
            linear_fp8_reference(x, args[6], None), linear_fp8_reference(x, args[7], None),
            linear_fp8_reference(y, args[8], None)]
    assert all(torch.equal(g, w) for g, w in zip(run(*args), want))


def test_a_view_a_column_cannot_take_leaves_the_group_alone(caplog):
    """q viewed flat: [M, N] columns of a [M, 3N] output have no flat view, so nothing merges."""
    def flat_q(x, wq, wk, wv):
        return F.linear(x, wq).view(-1), F.linear(x, wk), F.linear(x, wv)

    args = (_x(64, 128), _w(128, seed=1), _w(128, seed=2), _w(128, seed=3))
    with caplog.at_level("INFO", logger="sgdiff"):
        run, gm, result = rewrite(flat_q, args, quality="high", families=["fp8_gemm"])
    assert result.merged_projections == 0 and count_op(gm, SIBLINGS) == 0 and count_op(gm, LINEAR_FP8) == 3
    assert any("not merged: a value read from their strided columns cannot be made" in r.message for r in caplog.records)
    assert torch.equal(run(*args)[0], linear_fp8_reference(*args[:2], None).view(-1))


def test_values_read_from_a_column_get_its_strides():
    """What a column feeds is given the column's layout in the graph's metadata (the view of q
    is strided now), and what reads that view makes its own, contiguous output."""
    def cloned(x, wq, wk):
        q = F.linear(x, wq).view(1, 64, 128)
        return q.contiguous().view(64, 128) + 0, F.linear(x, wk)

    args = (_x(64, 128), _w(128, seed=1), _w(128, seed=2))
    run, gm, result = rewrite(cloned, args, quality="high", families=["fp8_gemm"])
    assert result.merged_projections == 1
    views = [n for n in gm.graph.nodes if n.target is torch.ops.aten.view.default and n.args[0].target is SLICE]
    assert [n.meta["val"].stride() for n in views] == [(64 * 256, 256, 1)]
    got = run(*args)
    assert torch.equal(got[0], linear_fp8_reference(args[0], args[1], None))
    assert got[0].is_contiguous()


def test_the_reference_is_each_projections_side_by_side():
    x, ws, bs = _x(3, 5, 64), [_w(32, 64, 1), _w(16, 64, 2)], [_b(32, 1), _b(16, 2)]
    got = linear_fp8_siblings_reference(x, ws, bs)
    assert torch.equal(got, torch.cat([linear_fp8_reference(x, w, b) for w, b in zip(ws, bs)], 1))
    with pytest.raises(ValueError, match="one each, or none"):
        linear_fp8_siblings_reference(x, ws, bs[:1])


FUSED = registry.op_def("layernorm_modulate_linear_fp8").load()
NORM = registry.op_def("layernorm_modulate").load()


def _block_input(x, emb, *projections, also_return_norm=False):
    """A DiT block's modulated input (Flux's chunked adaLN) into its projections."""
    shift, scale = emb[:, None].chunk(2, dim=-1)
    h = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale) + shift
    outs = tuple(F.linear(h, *p) for p in projections)
    return (*outs, h) if also_return_norm else outs


def _norm_args(d=128):
    return _x(2, 64, d), (torch.randn(2, 2 * d, generator=torch.Generator().manual_seed(3)) * 0.3).to(BF16)


def test_a_modulated_norm_read_only_by_fp8_projections_makes_their_rows():
    def qkv(x, emb, wq, bq, wk, bk, wv, bv):
        return _block_input(x, emb, (wq, bq), (wk, bk), (wv, bv))

    args = (*_norm_args(), _w(128, seed=1), _b(128, 1), _w(128, seed=2), _b(128, 2), _w(96, seed=3), _b(96, 3))
    run, gm, result = rewrite(qkv, args, quality="high", families=["modulate", "fp8_gemm"])
    assert result.counts == {"modulate": 1, "fp8_gemm": 3} and result.merged_projections == 1
    assert result.folded_norms == 1
    assert count_op(gm, FUSED) == 1 and count_op(gm, NORM) == count_op(gm, SIBLINGS) == count_op(gm, LINEAR_FP8) == 0
    # the op's math: the norm as eager computes it (the lossless op's bits), the projections' FP8 GEMMs of it
    h = _block_input(*args[:2], also_return_norm=True)[-1]
    want = [linear_fp8_reference(h, w, b).view(2, 64, -1) for w, b in zip(args[2::2], args[3::2])]
    assert all(torch.equal(g, w) for g, w in zip(run(*args), want))


def test_one_projection_of_a_modulated_norm_is_folded_too():
    run, gm, result = rewrite(lambda x, emb, w, b: _block_input(x, emb, (w, b)),
                              (*_norm_args(), _w(256, seed=1), _b(256, 1)), quality="high",
                              families=["modulate", "fp8_gemm"])
    assert result.folded_norms == 1 and count_op(gm, FUSED) == 1 and count_op(gm, NORM) == 0
    (node,) = [n for n in gm.graph.nodes if n.target is FUSED]
    assert len(node.args[-2]) == 1 and len(node.args[-1]) == 1


def test_a_norm_read_elsewhere_too_stays_and_its_projections_read_it():
    args = (*_norm_args(), _w(128, seed=1), _b(128, 1), _w(128, seed=2), _b(128, 2))
    run, gm, result = rewrite(lambda x, emb, wq, bq, wk, bk: _block_input(x, emb, (wq, bq), (wk, bk),
                                                                          also_return_norm=True),
                              args, quality="high", families=["modulate", "fp8_gemm"])
    assert result.folded_norms == 0 and count_op(gm, FUSED) == 0
    assert count_op(gm, NORM) == 1 and count_op(gm, SIBLINGS) == 1
    h = _block_input(*args[:2], also_return_norm=True)[-1]
    got = run(*args)
    assert torch.equal(got[-1], h) and torch.equal(got[0], linear_fp8_reference(h, *args[2:4]).view(2, 64, -1))


def test_the_fused_reference_is_the_norm_then_the_projections():
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
    from sgdiff.kernels.layernorm_modulate_linear_fp8 import layernorm_modulate_linear_fp8_reference

    x, emb = _norm_args(64)
    shift, scale = emb[:, None].chunk(2, dim=-1)
    ws, bs = [_w(32, 64, 1), _w(48, 64, 2)], [_b(32, 1), _b(48, 2)]
    h = layernorm_modulate_reference(x, None, None, 1e-6, scale, shift)
    got = layernorm_modulate_linear_fp8_reference(x, None, None, 1e-6, scale, shift, True, None, None, None, None,
                                                  ws, bs)
    assert torch.equal(got, linear_fp8_siblings_reference(h, ws, bs))


def test_where_its_kernel_does_not_take_the_inputs_the_fused_op_runs_the_two_ops():
    """The GPU fallback (a channels-first x, a GPU without FP8 GEMMs): the norm's op, then the
    projections' op, each by its own best implementation (on the CPU: their references)."""
    pytest.importorskip("triton")
    from sgdiff.kernels.layernorm_modulate_linear_fp8 import layernorm_modulate_linear_fp8_reference
    from sgdiff.kernels.triton.layernorm_modulate_fp8 import layernorm_modulate_then_linears

    x, emb = _norm_args(64)
    x = x.transpose(1, 2).contiguous().transpose(1, 2)  # channels-first storage read as [B, S, D]
    shift, scale = emb[:, None].chunk(2, dim=-1)
    args = (x, None, None, 1e-6, scale, shift, True, None, None, None, None, [_w(32, 64, 1), _w(48, 64, 2)],
            [_b(32, 1), _b(48, 2)])
    assert torch.equal(layernorm_modulate_then_linears(*args), layernorm_modulate_linear_fp8_reference(*args))
