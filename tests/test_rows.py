"""Row addressing of the elementwise Triton kernels (sgdiff.kernels.triton.rows), on the CPU."""
import pytest
import torch
from hypothesis import given, strategies as st

pytest.importorskip("triton")

from sgdiff.kernels.triton.rows import innermost_last, rows_fit  # noqa: E402


def _addressed(t: torch.Tensor, shape4, strides4) -> torch.Tensor:
    """The elements a kernel reads of ``t`` (unique values in its storage), row-major over shape4."""
    return torch.as_strided(t, shape4, strides4, t.storage_offset())


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), perm_seed=st.integers(0, 23),
       broadcast=st.lists(st.booleans(), min_size=4, max_size=4), sliced=st.booleans())
def test_innermost_last_reads_every_element_in_out_order(shape, perm_seed, broadcast, sliced):
    n = len(shape)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed)).tolist()
    out = torch.empty([shape[p] for p in perm]).permute(*torch.argsort(torch.tensor(perm)).tolist())
    base = torch.arange(2 * out.numel() + 7, dtype=torch.float32)
    operand = base[3:3 + out.numel()].view(out.shape)  # contiguous, at an offset
    if sliced:  # a chunk of a wider last dim, as a projection's halves are
        operand = base[: 2 * out.numel()].view(*out.shape[:-1], 2 * out.shape[-1])[..., out.shape[-1]:]
    bshape = [1 if (b and i < n - 1) else s for i, (s, b) in enumerate(zip(out.shape, broadcast))]
    vector = base[: torch.Size(bshape).numel()].view(bshape)  # broadcast along some dims
    shape4, strides = innermost_last(out, operand, vector)
    assert len(shape4) == 4 and torch.Size(shape4).numel() == out.numel()
    order = sorted(range(n), key=lambda d: (-out.stride(d), d))
    for t, st4 in zip((out, operand, vector), strides):
        src = t if t is not out else base[: out.numel()].as_strided(out.shape, out.stride())
        want = src.expand(out.shape).permute(*order).reshape(-1)
        assert torch.equal(_addressed(src, shape4, st4).reshape(-1), want)
    assert shape4[-1] == out.shape[order[-1]]  # the kernels' D stays the innermost dim


def test_rows_that_step_as_one_merge_into_one_dim():
    # Sana's GLU: channels-last halves of a depthwise convolution, [2, 5600, 32, 32]
    conv = torch.empty(2, 11200, 32, 32).to(memory_format=torch.channels_last)
    a, b = conv.chunk(2, dim=1)
    out = torch.empty_like(a, memory_format=torch.channels_last)
    bias = torch.empty(5600).view(-1, 1, 1)
    shape4, strides = innermost_last(out, a, b, bias)
    assert shape4 == (2048, 1, 1, 5600)  # n1 = n2 = 1: no division per row
    assert strides == [(5600, 0, 0, 1), (11200, 0, 0, 1), (11200, 0, 0, 1), (0, 0, 0, 1)]
    # a [B, 1, D] modulation stops the batch and token dims from merging: one division left
    x, scale = torch.empty(2, 5, 16), torch.empty(2, 96)[:, None, :16]
    assert innermost_last(torch.empty(2, 5, 16), x, scale)[0] == (2, 5, 1, 16)


def test_rms_norm_rows_merge_where_x_and_out_step_as_one():
    from sgdiff.kernels.triton import rms_norm as trms
    for form in ("fused", "diffusers"):
        x_strides = slice(4, 7) if form == "fused" else slice(3, 6)  # the diffusers form compiles N in
        # per-head q, [B, S, H, D] contiguous: one row dim, no division per row
        ints = trms._plan(torch.empty(1, 46, 24, 128), form)[2]
        assert ints[:3] == (46 * 24, 1, 1) and ints[x_strides] == (128, 0, 0), form
        # a heads-first view of it: rows step through S and H apart
        ints = trms._plan(torch.empty(1, 24, 46, 128).transpose(1, 2), form)[2]
        assert ints[:3] == (46 * 24, 46, 24) and ints[x_strides] == (24 * 46 * 128, 128, 46 * 128), form


def test_rows_fit():
    assert rows_fit(torch.empty(0), 1) and rows_fit(torch.empty(4, 8), 8)
    big = torch.empty(1).expand(2**31 - 1, 2)  # rows that fit, elements that do not (no storage)
    assert rows_fit(big, 2) and not rows_fit(big, 1)
    from sgdiff.kernels.triton import residual_gate as trg  # 32-bit rows: too many fall back
    rows = torch.empty(2**31, 2, device="meta")
    assert not trg.supported_layout(rows, rows, rows, "plain") and trg.supported_layout(rows[:4], rows[:4], rows[:4], "plain")


HALVES = r"""
import torch, triton, triton.language as tl
from sgdiff.kernels.triton.rows import halves

@triton.jit
def k(x_ptr, a_ptr, b_ptr, R: tl.constexpr, W: tl.constexpr):
    r, c = tl.arange(0, R), tl.arange(0, W)
    a, b = halves(tl.load(x_ptr + r[:, None] * W + c[None, :]))
    h = tl.arange(0, W // 2)
    tl.store(a_ptr + r[:, None] * (W // 2) + h[None, :], a)
    tl.store(b_ptr + r[:, None] * (W // 2) + h[None, :], b)

x = torch.randn(4, 32)
x[0, :4] = torch.tensor([-0.0, 0.0, float("inf"), -float("inf")])
x[1, 16:20] = torch.tensor([-0.0, 0.0, -1e-40, 1e-40])   # signed zeros, subnormals
x.view(torch.int32)[2, 3] = -4194305                      # a NaN with a payload and its sign set
x.view(torch.int32)[3, 17] = 0x7F800001                   # a signalling NaN
a, b = torch.empty(4, 16), torch.empty(4, 16)
k[(1,)](x, a, b, R=4, W=32)
assert torch.equal(a.view(torch.int32), x[:, :16].contiguous().view(torch.int32))
assert torch.equal(b.view(torch.int32), x[:, 16:].contiguous().view(torch.int32))
print("ok")
"""


def test_halves_returns_each_half_bit_for_bit():
    """``halves`` moves values, never computes them: signed zeros, infinities, subnormals
    and NaN payloads come through bit for bit (under the interpreter; the GPU tests cover
    the kernels that use it)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HALVES], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
