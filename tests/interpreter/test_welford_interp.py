"""welford_combine_pow2 against welford_combine (sgdiff/kernels/triton/welford.py) under Triton's
CPU interpreter, whose fp32 division is the GPU's (correctly rounded). Run by
tests/test_triton_interpreter.py with TRITON_INTERPRET=1 (skipped without it).
"""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sgdiff.kernels.triton.welford import welford_combine, welford_combine_pow2  # noqa: E402

pytestmark = pytest.mark.interpreter


@triton.jit
def both(m_ptr, q_ptr, n_ptr, out_ptr, SIZE: tl.constexpr):
    i = tl.arange(0, SIZE)
    own = (tl.load(m_ptr + i), tl.load(q_ptr + i), tl.load(n_ptr + i))
    oth = (tl.load(m_ptr + SIZE + i), tl.load(q_ptr + SIZE + i), tl.load(n_ptr + SIZE + i))
    a = welford_combine(own[0], own[1], own[2], oth[0], oth[1], oth[2])
    b = welford_combine_pow2(own[0], own[1], own[2], oth[0], oth[1], oth[2])
    for k in tl.static_range(3):
        tl.store(out_ptr + k * SIZE + i, a[k])
        tl.store(out_ptr + (3 + k) * SIZE + i, b[k])


def test_power_of_two_reciprocal_from_bits_is_ieee_division():
    """welford_combine_pow2 (1 / count from the count's bits) against welford_combine (IEEE
    division) on counts whose sums are 0 or powers of two up to 2**21, equal and empty
    partners, means from 1e-30 to 1e30 with zeros, inf, NaN and subnormals: the same bits."""
    torch.manual_seed(0)
    SIZE = 1024
    counts = torch.tensor([0.0] + [2.0 ** e for e in range(21)])
    own_n, oth_n = counts[torch.randint(0, 22, (SIZE,))], counts[torch.randint(0, 22, (SIZE,))]
    same = torch.rand(SIZE) < 0.5
    oth_n = torch.where(same, own_n, oth_n)                     # equal counts: the sum a power of two
    oth_n = torch.where(torch.rand(SIZE) < 0.2, 0.0, oth_n)     # an empty partner
    keep = ((own_n + oth_n) == 0) | (((own_n + oth_n).view(torch.int32) & 0x7FFFFF) == 0)
    own_n, oth_n = own_n[keep], oth_n[keep]
    size = 1 << (own_n.numel().bit_length() - 1)
    assert size >= 256, size
    own_n, oth_n = own_n[:size], oth_n[:size]
    mean = torch.randn(2 * size) * torch.tensor([1e-30, 1.0, 1e30])[torch.randint(0, 3, (2 * size,))]
    mean[:7] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-40, -3.0, 2.0 ** -126])
    m2 = torch.rand(2 * size) * 10
    n = torch.cat([own_n, oth_n])
    mean = torch.where(n == 0, 0.0, mean)
    m2 = torch.where(n == 0, 0.0, m2)
    out = torch.empty(6 * size)
    both[(1,)](mean, m2, n, out, SIZE=size)
    a, b = out.view(6, size)[:3], out.view(6, size)[3:]
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num().view(torch.int32), b.nan_to_num().view(torch.int32))
