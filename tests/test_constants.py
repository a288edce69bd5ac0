"""Input-independent values computed once at compile time (fxpasses/constants.py): folded where
they depend on no input, eager's bits either way, and never folded where a call could differ."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from sgdiff.fxpasses.constants import fold_constants

aten = torch.ops.aten


def _table(n: int) -> torch.Tensor:  # a RoPE-like table from sizes alone, as get_3d_rotary_pos_embed builds
    pos = torch.linspace(0, 1, n, dtype=torch.float32)
    freqs = torch.outer(pos, torch.arange(4, dtype=torch.float32) / 4)
    return torch.cat([freqs.cos(), freqs.sin()], -1)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_table_from_sizes_is_computed_once_and_reads_as_a_constant():
    def f(x):
        return x * _table(x.shape[0]).to(x.dtype)

    x = torch.randn(6, 8)
    gm = make_fx(f)(x)
    assert aten.linspace.default in _targets(gm)
    assert fold_constants(gm) == 1
    assert aten.linspace.default not in _targets(gm) and aten.cos.default not in _targets(gm)
    assert _targets(gm) == [aten.mul.Tensor]
    assert torch.equal(gm(x), f(x))
    y = torch.randn(6, 8)  # a new input reads the same constant
    assert torch.equal(gm(y), f(y))


def test_what_depends_on_an_input_or_draws_random_numbers_is_left_to_each_call():
    def f(x):
        scale = x.sum() * torch.full((8,), 2.0)  # the product depends on x (the full is folded)
        noise = torch.rand(8)  # random: a fresh draw per call
        scratch = torch.empty(8)  # uninitialized bytes
        return x * scale + noise + scratch.zero_()

    gm = make_fx(f)(torch.randn(6, 8))
    assert fold_constants(gm) == 1
    left = _targets(gm)
    assert aten.full.default not in left
    assert {aten.sum.default, aten.rand.default, aten.empty.memory_format, aten.zero_.default} <= set(left)


def test_a_returned_value_stays_a_fresh_tensor_per_call():
    def f(x):
        return x + 1, torch.arange(4, dtype=torch.float32) * 2

    gm = make_fx(f)(torch.randn(3))
    fold_constants(gm)
    a, b = gm(torch.randn(3))[1], gm(torch.randn(3))[1]
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_compiled_model_with_a_table_built_in_forward_is_eager_bitwise():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) * _table(x.shape[1]).to(x.dtype)

    m, x = M().eval(), torch.randn(2, 6, 8)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(m, backend="sgdiff")(x)
            want = m(x)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, want)


def test_views_of_a_folded_value_stay_in_the_graph():
    """The families match chains through their views (a RoPE chain's select of its table): the
    constant is the value before the views, which keep reading it."""
    def f(x):
        table = _table(x.shape[0]).unsqueeze(0)
        return x * table.select(0, 0)[..., :4]

    gm = make_fx(f)(torch.randn(6, 4))
    assert fold_constants(gm) == 1
    left = _targets(gm)
    assert aten.cos.default not in left and aten.cat.default not in left
    assert {aten.unsqueeze.default, aten.select.int, aten.slice.Tensor} <= set(left)
    x = torch.randn(6, 4)
    assert torch.equal(gm(x), f(x))
