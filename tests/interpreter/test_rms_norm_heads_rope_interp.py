"""rms_norm_heads_rope under the interpreter: the fused RMSNorm over a row of heads, then each head
rotated, on one pass, equal to the two kernels one after the other (the fused norm's kernel, then
sgdiff::rope_even_odd's or sgdiff::rope's: the interpreter rounds alike in both) and, in fp32,
to the chain's reference; rows of one chunk, of several, and of a partial last one."""
import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.rms_norm_heads_rope import rms_norm_heads_rope_reference  # noqa: E402
from sgdiff.kernels.triton import rms_norm as trms, rms_norm_rope as trr, rope as trope  # noqa: E402
from tests.interpreter.common import FP32_BF16, check, ids  # noqa: E402

pytestmark = pytest.mark.interpreter


def _inputs(shape, heads, rotation, dtype, weighted, seed=0):
    g = torch.Generator().manual_seed(seed)
    *lead, n = shape
    d = n // heads
    x = (torch.randn(*shape, generator=g) * 2).to(dtype)
    w = torch.randn(n, generator=g).to(dtype) if weighted else None
    width = d // 2 if rotation == "even_odd" else d
    freqs = [torch.randn(lead[-1], width, generator=g) for _ in range(2)]  # a table per token, shared by heads
    cos, sin = (f.view(*([1] * (len(lead) - 1)), lead[-1], 1, width) for f in freqs)
    return x, w, cos, sin


# (shape, heads): Wan's 12 heads of 128 at 3 chunks of 512; 3 heads of 128 (a partial chunk); 6 of 64; one of 128
GEOMETRIES = [((2, 9, 1536), 12), ((1, 7, 384), 3), ((2, 5, 384), 6), ((3, 4, 128), 1)]


@pytest.mark.parametrize("rotation", ["even_odd", "interleaved", "halves"])
@pytest.mark.parametrize("shape,heads", GEOMETRIES, ids=ids)
@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
def test_one_pass_equals_the_two_kernels(shape, heads, rotation, dtype):
    weighted = heads != 6
    x, w, cos, sin = _inputs(shape, heads, rotation, dtype, weighted)
    args = (x, w, 1e-6, "fused", heads, cos, sin, rotation)
    assert trr.supported_layout_heads(*args)
    y = trr.heads_view(trms.rms_norm(x, w, 1e-6, "fused"), heads)
    two = trope.rope_even_odd(y, cos, sin) if rotation == "even_odd" else trope.rope(y, cos, sin,
                                                                                     rotation == "interleaved")
    got = trr.rms_norm_heads_rope(*args)
    check(got, two, True)
    if dtype == torch.float32:  # no bf16 rounding: the interpreter's fp32 is the reference's
        check(got, rms_norm_heads_rope_reference(*args), False, tol=1e-6)


def test_refusals():
    x, w, cos, sin = _inputs((2, 9, 1536), 12, "even_odd", torch.bfloat16, True)
    assert not trr.supported_layout_heads(x, w, 1e-6, "diffusers", 12, cos, sin, "even_odd")  # another norm form
    assert not trr.supported_layout_heads(x, w, 1e-6, "fused", 7, cos, sin, "even_odd")  # heads do not divide
    assert not trr.supported_layout_heads(x, w, 1e-6, "fused", 12, cos, sin, "other")
    assert not trr.supported_layout_heads(x, w, 1e-6, "fused", 12, cos, sin, "interleaved")  # half-width tables
    x5, w5, cos5, sin5 = _inputs((2, 9, 480), 5, "even_odd", torch.bfloat16, True)  # head_dim 96: not a chunk's divisor
    assert not trr.supported_layout_heads(x5, w5, 1e-6, "fused", 5, cos5, sin5, "even_odd")
