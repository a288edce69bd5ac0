"""gelu_linear_fp8's row pass under the interpreter: the e4m3 rows and scales of ``[head |
gelu(x)]`` are linear_fp8's quantization of the reference's rows (the GELU as
``gelu_tanh_fast``), within a bf16 rounding (the interpreter truncates fp32 to bf16 where the GPU
rounds, and its exp2 is numpy's: the share of values whose bits differ is the GPU test's,
tests/gpu/test_fp8_gpu.py); the head read through its strides, 2 to 4
dims, rows of several programs and one."""
import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.gelu_linear_fp8 import fast_gelu_input  # noqa: E402
from sgdiff.kernels.linear_fp8 import quantize_rows_reference  # noqa: E402
from sgdiff.kernels.triton import gelu_linear_fp8 as glf  # noqa: E402
from tests.helpers import assert_e4m3_rows_close  # noqa: E402

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


def _head(lead, d, transposed):
    if transposed:  # SDPA's [B, H, S, Dh] output viewed [B, S, H Dh]
        return torch.randn(lead[0], 2, lead[1], d // 2).to(BF16).transpose(1, 2).flatten(2, 3)
    return torch.randn(*lead, d).to(BF16)


@pytest.mark.parametrize("lead,dx,dh,transposed", [((2, 8), 96, 0, False), ((5,), 160, 0, False),
                                                   ((1, 7), 256, 64, True), ((3, 4, 5), 48, 16, False),
                                                   ((2, 3), 1536, 0, False)])
def test_the_rows_are_the_quantization_of_the_gelu_and_cat(lead, dx, dh, transposed):
    x = (torch.randn(*lead, dx) * 3).to(BF16)
    x.view(-1, dx)[0] = 0  # a row of zeros (without a head) keeps the floor scale
    head = _head(lead, dh, transposed) if dh else None
    q, scale = glf.gelu_rows_fp8(x, head)
    rows = fast_gelu_input(x, head).reshape(-1, dh + dx)
    want_q, want_scale = quantize_rows_reference(rows)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (rows.shape[0], dh + dx) and scale.shape == (rows.shape[0], 1)
    if not dh:  # the row of zeros keeps the floor scale
        assert torch.equal(scale[0], want_scale[0])
    assert_e4m3_rows_close(q, scale, want_q, want_scale, differing=0.25)


def test_the_op_runs_the_fp8_gemm_on_those_rows(monkeypatch):
    """The launch hands linear_fp8's GEMM the rows and scales of the pass, and the weight."""
    from sgdiff.kernels.triton import linear_fp8 as lf

    seen = []
    monkeypatch.setattr(lf, "gemm_of_rows", lambda q, s, w, b, dtype: seen.append((q, s, w, b, dtype)) or q)
    x, head = torch.randn(1, 8, 64).to(BF16), _head((1, 8), 32, True)
    w, b = torch.randn(48, 96).to(BF16), torch.randn(48).to(BF16)
    glf.gelu_linear_fp8(x, w, b, head)
    (q, s, w_seen, b_seen, dtype), = seen
    want_q, want_s = glf.gelu_rows_fp8(x, head)
    assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s)
    assert w_seen is w and b_seen is b and dtype == BF16
