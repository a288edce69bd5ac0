"""Triton kernels run under Triton's CPU interpreter on every commit.

The interpreter computes fp32 like the GPU (fma, correctly rounded division) but truncates
fp32 -> bf16 and has no approximate rsqrt, so bf16 results are compared with a tolerance and
exactness is claimed only on the GPU (tests/gpu).
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r"""
    import torch, torch.nn.functional as F
    from sgdiff.kernels.triton import layernorm_modulate as tk
    from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference as ref
    torch.manual_seed(0)
    cases = 0
    for dtype, rtol in [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)]:
        for B, S, N in [(2, 3, 64), (1, 5, 2240), (2, 2, 516), (1, 1, 1152)]:
            x = torch.randn(B, S, N + 4, dtype=dtype)[..., :N] * 3 + 1   # strided rows
            emb = torch.randn(B, 6 * N, dtype=dtype)
            shift, scale = emb[:, None].chunk(6, dim=-1)[:2]
            per_token = torch.randn(B, S, N, dtype=dtype)
            w, b = torch.randn(N, dtype=dtype), torch.randn(N, dtype=dtype)
            for args in [(x, None, None, 1e-6, scale, shift, True), (x, w, b, 1e-5, scale, None, True),
                         (x, w, None, 1e-6, per_token, shift, True), (x, None, b, 1e-6, scale, per_token, False),
                         (x[0], None, None, 1e-6, scale[0, 0], shift[0, 0], True)]:
                assert tk.supported_layout(*args), args[0].shape
                got, want = tk.layernorm_modulate(*args), ref(*args)
                assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
                scale_ = want.float().abs().max().item()
                err = (got.float() - want.float()).abs().max().item()
                assert err <= rtol * scale_, (dtype, (B, S, N), err, scale_)
                cases += 1
    # layouts eager would normalize with another ATen kernel are refused
    x = torch.randn(2, 3, 66)
    s = torch.randn(2, 1, 66)
    assert not tk.supported_layout(x, None, None, 1e-6, s, s)            # N % 4 != 0
    x = torch.randn(2 * 3 * 64 + 1)[1:].view(2, 3, 64)
    assert not tk.supported_layout(x, None, None, 1e-6, s[..., :64], None)  # misaligned rows
    assert not tk.supported_layout(torch.randn(2, 3, 64), None, None, 1e-6,
                                   torch.randn(2, 1, 64, dtype=torch.bfloat16), None)  # mixed dtypes
    print("ok", cases)
""")


RESIDUAL_GATE = textwrap.dedent(r"""
    import torch
    from sgdiff.kernels.triton import residual_gate as tk
    from sgdiff.kernels.residual_gate import residual_gate_reference as ref
    torch.manual_seed(0)
    cases = 0
    for dt in (torch.float32, torch.bfloat16):
        r = torch.randn(2, 5, 96, dtype=dt)
        g = torch.randn(2, 1, 96, dtype=dt)
        u = torch.randn(2, 5, 192, dtype=dt)[..., :96]  # a chunk view
        for args in [(r, g, u, False), (r, g[:, 0][:, None], u, False), (r[0], g[0, 0], u[0], False),
                     (r.float(), g.float(), u, False)]:                 # Wan: fp32 stream, bf16 update
            assert tk.supported_layout(*args)
            got, want = tk.residual_gate(*args), ref(*args)
            assert got.dtype == want.dtype and got.shape == want.shape
            if got.dtype == torch.float32:   # the interpreter's fp32 is the GPU's: exact
                assert torch.equal(got, want)
            else:                            # it truncates to bf16: an ulp per rounding
                err = (got.float() - want.float()).abs().max().item()
                assert err <= 2 ** -6 * want.float().abs().max().item(), err
            cases += 1
    assert not tk.supported_layout(r, g, u, True)                    # tanh gates: the reference
    assert not tk.supported_layout(r[:, :1], g, u, False)            # broadcasts past the residual
    assert not tk.supported_layout(r.transpose(0, 1), g.transpose(0, 1), u.transpose(0, 1), False)
    print("ok", cases)
""")


def test_residual_gate_kernel_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", RESIDUAL_GATE], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "8"]


def test_layernorm_modulate_kernel_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "40"]
