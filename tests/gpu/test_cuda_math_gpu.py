"""sgdiff's copies of CUDA's fp32 math functions against ATen's CUDA kernels, over every fp32
value: ``tanhf`` (written without libdevice's branches) against ``torch.tanh``, ``expf``
and ``expf_parts`` (its product, of x and of -x) against ``torch.exp``; and
``count_reciprocal`` (div.rn's fast path) against ``torch.reciprocal`` for every count below
2**24; ``silu_rounded`` against ``F.silu`` for every bf16 and fp16 value. A function that
differs on one input fails."""
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sgdiff.kernels.triton.cuda_math import count_reciprocal, expf, expf_parts, libdevice_options, silu_rounded, tanhf
from tests.helpers import every_16bit_value

pytestmark = pytest.mark.gpu
CHUNK = 1 << 28  # fp32 values a pass: 1 GiB in, 1 GiB out per function


@triton.jit
def _math_kernel(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    if FN == "tanh":
        y = tanhf(x, False)
    elif FN == "exp":
        y = expf(x, False)
    elif FN == "exp_parts":
        p, s = expf_parts(x)
        y = p * s
    elif FN == "exp_parts_negated":
        p, s = expf_parts(x, NEGATE=True)
        y = p * s
    else:
        y = count_reciprocal(x)
    tl.store(out_ptr + i, y, mask=i < n)


@triton.jit
def _silu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(out_ptr + i, silu_rounded(x.to(tl.float32), out_ptr.dtype.element_ty, False), mask=i < n)


def _same_bits_or_both_nan(got, want):
    """Positions where the results differ (any NaN matches any NaN: payloads are not compared)."""
    both_nan = got.isnan() & want.isnan()
    bits = {4: torch.int32, 2: torch.int16}[got.element_size()]
    return ~both_nan & (got.view(bits) != want.view(bits))


@pytest.mark.parametrize("fn,reference", [("tanh", torch.tanh), ("exp", torch.exp), ("exp_parts", torch.exp),
                                          ("exp_parts_negated", lambda x: torch.exp(-x))])
def test_every_fp32_value(fn, reference):
    bits = torch.empty(CHUNK, dtype=torch.int32, device="cuda")
    out = torch.empty(CHUNK, dtype=torch.float32, device="cuda")
    for start in range(-2 ** 31, 2 ** 31, CHUNK):
        torch.arange(start, start + CHUNK, dtype=torch.int32, device="cuda", out=bits)
        x = bits.view(torch.float32)
        _math_kernel[(triton.cdiv(CHUNK, 1024),)](x, out, CHUNK, FN=fn, BLOCK=1024, enable_fp_fusion=False,
                                                  **libdevice_options())
        wrong = _same_bits_or_both_nan(out, reference(x))
        assert not wrong.any(), (fn, x[wrong][:8].tolist(), out[wrong][:8].tolist(), reference(x)[wrong][:8].tolist())


def test_count_reciprocals_are_ieee():
    n = torch.arange(1, 1 << 24, device="cuda", dtype=torch.float32)  # every count fp32 holds exactly
    out = torch.empty_like(n)
    _math_kernel[(triton.cdiv(n.numel(), 1024),)](n, out, n.numel(), FN="reciprocal", BLOCK=1024, enable_fp_fusion=False)
    want = torch.reciprocal(n)
    wrong = out.view(torch.int32) != want.view(torch.int32)
    assert not wrong.any(), (n[wrong][:8].tolist(), out[wrong][:8].tolist(), want[wrong][:8].tolist())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_rounded_every_16bit_value(dtype):
    """Its quotient is not IEEE's; its rounding to 16 bits is, for each of the 65536 inputs."""
    x = every_16bit_value(dtype)
    out = torch.empty_like(x)
    _silu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024, enable_fp_fusion=False,
                                                  **libdevice_options())
    want = F.silu(x)
    wrong = _same_bits_or_both_nan(out, want)
    assert not wrong.any(), (x[wrong][:8].tolist(), out[wrong][:8].tolist(), want[wrong][:8].tolist())
