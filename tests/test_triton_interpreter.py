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
    import itertools
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
                         (x, w, None, 1e-6, per_token, shift, True), (x, w, b, 1e-6, scale, per_token, False),
                         (x[0], None, None, 1e-6, scale[0, 0], shift[0, 0], True)]:
                assert tk.supported_layout(*args), args[0].shape
                got, want = tk.layernorm_modulate(*args), ref(*args)
                assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
                scale_ = want.float().abs().max().item()
                err = (got.float() - want.float()).abs().max().item()
                assert err <= rtol * scale_, (dtype, (B, S, N), err, scale_)
                cases += 1
    # the row normalized from registers or read again: the same arithmetic, the same bits
    keep_row = tk._keep_row
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 2240, dtype=dtype) * 3 + 1
        w, b, sc = (torch.randn(2240, dtype=dtype) for _ in range(3))
        outs = []
        for keep in (True, False):
            tk._keep_row = lambda *_, keep=keep: keep
            outs.append(tk.layernorm_modulate(x, w, b, 1e-6, sc, sc, True))
        tk._keep_row = keep_row
        assert torch.equal(*outs), dtype
        cases += 1
    wan = torch.empty(1, 32760, 5120, dtype=torch.float32, device="meta")
    assert tk._keep_row(wan, 32760, 10) and not tk._keep_row(wan.bfloat16(), 32760, 10)
    assert tk._keep_row(wan.bfloat16(), 2048, 5) and not tk._keep_row(wan.bfloat16(), 4608, 6)
    # layer_norm: the same kernel without the modulation, over head_dim (per-head QK norm), any rows
    from sgdiff.kernels.layer_norm import layer_norm_reference
    # (head_dim <= 128: 16 rows a program, one per warp's lanes; 256: one row a program)
    for (dtype, rtol), D in itertools.product([(torch.float32, 2e-5), (torch.bfloat16, 3e-2)], (64, 72, 128, 256)):
        q = torch.randn(2, 7, 3 * D, dtype=dtype).unflatten(-1, (3, D)) * 3 + 1
        for x, w, b in [(q, None, None), (q, torch.randn(D, dtype=dtype), torch.randn(D, dtype=dtype)),
                        (q.transpose(1, 2), torch.randn(D, dtype=dtype), None)]:   # heads-first view: copied
            assert tk.layer_norm_supported_layout(x, w, b, 1e-6)
            got, want = tk.layer_norm(x, w, b, 1e-6), layer_norm_reference(x, w, b, 1e-6)
            assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
            assert (got.float() - want.float()).abs().max().item() <= rtol * want.float().abs().max().item()
            cases += 1
    assert not tk.layer_norm_supported_layout(torch.randn(2, 3, 66), None, None, 1e-6)   # N % 4 != 0
    # Wan's casts around an fp32 norm: bf16 x read as the fp32 it is cast to, the result cast back
    xb = torch.randn(2, 5, 1540, dtype=torch.bfloat16)[..., :1536] * 3 + 1
    sc, sh = torch.randn(2, 6, 1536).chunk(6, dim=1)[:2]
    wf, bf = torch.randn(1536), torch.randn(1536)
    for fn, ref_fn, args in [
            (tk.layernorm_modulate, ref, (xb, None, None, 1e-6, sc, sh, True, torch.float32, torch.bfloat16)),
            (tk.layernorm_modulate, ref, (xb, None, None, 1e-6, sc, sh, True, torch.float32, None)),
            (tk.layer_norm, layer_norm_reference, (xb, wf, bf, 1e-6, torch.float32, torch.bfloat16)),
            (tk.layer_norm, layer_norm_reference, (xb[:, :, :128], wf[:128], None, 1e-6, torch.float32, torch.bfloat16))]:
        supported = tk.supported_layout if fn is tk.layernorm_modulate else tk.layer_norm_supported_layout
        assert supported(*args)
        got, want = fn(*args), ref_fn(*args)
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        rtol = 2e-5 if want.dtype == torch.float32 else 3e-2
        assert (got.float() - want.float()).abs().max().item() <= rtol * want.float().abs().max().item()
        cases += 1
    assert not tk.supported_layout(xb, None, None, 1e-6, sc, sh, True, torch.float16, None)      # a narrowing cast
    assert not tk.supported_layout(xb, None, None, 1e-6, sc.bfloat16(), sh.bfloat16(), True, torch.float32, None)
    assert not tk.layer_norm_supported_layout(xb, wf.bfloat16(), None, 1e-6, torch.float32, None)  # params not fp32
    # layouts eager would normalize with another ATen kernel are refused
    x = torch.randn(2, 3, 66)
    s = torch.randn(2, 1, 66)
    assert not tk.supported_layout(x, None, None, 1e-6, s, s)            # N % 4 != 0
    x = torch.randn(2 * 3 * 64 + 1)[1:].view(2, 3, 64)
    assert not tk.supported_layout(x, None, None, 1e-6, s[..., :64], None)  # misaligned rows
    assert not tk.supported_layout(torch.randn(2, 3, 64), None, None, 1e-6,
                                   torch.randn(2, 1, 64, dtype=torch.bfloat16), None)  # mixed dtypes
    b = torch.randn(64)  # a bias without a weight: eager's bits are not its vectorized kernel's
    assert not tk.supported_layout(torch.randn(2, 3, 64), None, b, 1e-6, s[..., :64], None)
    assert not tk.layer_norm_supported_layout(torch.randn(2, 3, 64), None, b, 1e-6)
    assert not tk.layer_norm_supported_layout(torch.randn(2, 3, 4, 64), None, b, 1e-6)
    print("ok", cases)
""")


RESIDUAL_GATE = textwrap.dedent(r"""
    import itertools
    import torch
    from sgdiff.kernels.triton import residual_gate as tk
    from sgdiff.kernels.residual_gate import residual_gate_reference as ref
    torch.manual_seed(0)
    cases = 0
    # rows of one tile (96) and of several column blocks, the last partial (1160: 10 of 128)
    for dt, D in itertools.product((torch.float32, torch.bfloat16), (96, 1160)):
        r = torch.randn(2, 5, D, dtype=dt)
        g = torch.randn(2, 1, D, dtype=dt)
        u = torch.randn(2, 5, 2 * D, dtype=dt)[..., :D]  # a chunk view
        b = torch.randn(D, dtype=dt)
        for args in [(r, g, u, False), (r, g[:, 0][:, None], u, False), (r[0], g[0, 0], u[0], False),
                     (r.float(), g.float(), u, False),                  # Wan: fp32 stream, bf16 update
                     (r, g, u, False, True, b), (r, g, u, False, True, b.float()),   # a linear's bias
                     (r, g, u, False, True, None, 3.0), (r, g, u, False, True, b, 0.7),   # / rescale_output_factor
                     (r, g, u, False, True, None, 1.0),                 # ... of 1: no product (tk.divides)
                     (r, g.float(), u, False, True, None, None, torch.bfloat16)]:  # Wan: (x.float() + y * g).type_as(x)
            assert tk.supported_layout(*args)
            got, want = tk.residual_gate(*args), ref(*args)
            if len(args) == 7:   # CUDA divides by a CPU scalar as a product with its fp32 reciprocal
                ub = args[2] + args[5] if args[5] is not None else args[2]
                want = ref(r, g, (ub.float() * tk.reciprocal(args[6])).to(ub.dtype), False)
            assert got.dtype == want.dtype and got.shape == want.shape
            if got.dtype == torch.float32:   # the interpreter's fp32 is the GPU's: exact
                assert torch.equal(got, want)
            else:                            # it truncates to bf16: an ulp per rounding
                err = (got.float() - want.float()).abs().max().item()
                assert err <= 2 ** -6 * want.float().abs().max().item(), err
            cases += 1
    from sgdiff.kernels.residual_add import residual_add_reference
    for args in [(r, u.contiguous(), 3.0, True), (r, u.contiguous().float(), 0.7, False),   # ungated, rescaled
                 (r, u.contiguous(), 1.0, False)]:
        assert tk.residual_add_supported_layout(*args)
        got, want = tk.residual_add(*args), residual_add_reference(*args)
        assert got.dtype == want.dtype and (got.float() - want.float()).abs().max().item() <= \
            2 ** -6 * want.float().abs().max().item()
        cases += 1
    assert not tk.residual_add_supported_layout(r, u, 3.0, True)   # a strided update: eager's layout may differ
    got, want = tk.residual_gate(r, g, u, True), ref(r, g, u, True)   # tanh gates (numpy's tanh)
    assert (got.float() - want.float()).abs().max().item() <= 2 ** -6 * want.float().abs().max().item()
    assert not tk.supported_layout(r[:, :1], g, u, False)            # broadcasts past the residual
    assert not tk.supported_layout(r.transpose(0, 1), g.transpose(0, 1), u.transpose(0, 1), False)
    print("ok", cases)
""")


ROWWISE = textwrap.dedent(r"""
    import itertools
    import torch
    import torch.nn.functional as F
    from sgdiff.kernels.triton import gelu_tanh_cat as tgelu, rms_norm as trms, rope as trope, silu_mul as tsilu
    from sgdiff.kernels.triton import rms_norm_rope as trr, cast_copy as tcast
    from sgdiff.kernels.cast_copy import cast_copy_reference
    from sgdiff.kernels.triton import linear_attention_out as tlao
    from sgdiff.kernels.linear_attention_out import linear_attention_out_reference
    from sgdiff.kernels.gelu_tanh_cat import gelu_tanh_cat_reference
    from sgdiff.kernels.rope import rope_reference
    from sgdiff.kernels.rope_even_odd import rope_even_odd_reference
    from sgdiff.kernels.rms_norm import rms_norm_reference
    from sgdiff.kernels.silu_mul import silu_mul_reference
    from sgdiff.kernels.modulate import modulate_reference
    from sgdiff.kernels.triton import modulate as tmod, rmsnorm_modulate as trmod
    from sgdiff.kernels.rmsnorm_modulate import rmsnorm_modulate_reference
    torch.manual_seed(0)
    cases = 0

    def check(got, want, exact, tol=2 ** -6):
        global cases
        assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
        if exact:
            assert torch.equal(got, want), (got - want).abs().max()
        else:   # bf16 under the interpreter: truncation, an ulp or two per rounding
            err = (got.float() - want.float()).abs().max().item()
            assert err <= tol * max(1.0, want.float().abs().max().item()), err
        cases += 1

    def sqrt32(v):
        # correctly rounded fp32 sqrt, as the interpreter's (torch's CPU sqrt can be an ulp off);
        # through fp64, whose double rounding is exact for sqrt
        return torch.sqrt(v.double()).float()

    def cuda_order_rms(x, w, eps):
        # ATen's CUDA reduction order for mean(-1) of the squares, written with elementwise
        # fp32 adds only (see sgdiff/kernels/triton/rms_norm.py), then diffusers' RMSNorm
        xf = x.float()
        sq = (xf * xf).reshape(-1, x.shape[-1])
        M, N = sq.shape
        if N >= 128:
            K = -(-N // 128)
            v = F.pad(sq, (0, K * 128 - N)).view(M, K, 32, 4)
            acc = v[:, 0]
            for k in range(1, K):
                acc = acc + v[:, k]
        else:
            acc = F.pad(sq, (0, 128 - N)).view(M, 4, 32).transpose(1, 2)
        lanes = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
        for off in (16, 8, 4, 2, 1):
            lanes = torch.cat([lanes[:, :off] + lanes[:, off:2 * off], lanes[:, 2 * off:]], 1)
        mean = lanes[:, 0] * trms.mean_factor(M, N)
        r = 1.0 / sqrt32(mean + torch.tensor(eps, dtype=torch.float32))
        y = (xf.reshape(M, N) * r[:, None]).view(x.shape)
        if w is None:
            return y.to(x.dtype)
        return (y.to(w.dtype) if w.dtype != torch.float32 else y) * w

    def cuda_order_fused(x, w, eps):
        # ATen's vectorized RMSNorm (128 threads, fma per thread, warp trees, (w0+w2)+(w1+w3));
        # x holds bf16 values, so x * x is exact and fma(x, x, acc) == acc + x * x
        xf = x.float().reshape(-1, x.shape[-1])
        M, N = xf.shape
        K = -(-N // 512)
        v = F.pad(xf, (0, K * 512 - N)).view(M, K, 128, 4)
        acc = torch.zeros(M, 128)
        for k in range(K):
            for j in range(4):
                acc = acc + v[:, k, :, j] * v[:, k, :, j]
        warps = acc.view(M, 4, 32)
        for off in (16, 8, 4, 2, 1):
            warps = torch.cat([warps[..., :off] + warps[..., off:2 * off], warps[..., 2 * off:]], -1)
        s = warps[..., 0]
        total = (s[:, 0] + s[:, 2]) + (s[:, 1] + s[:, 3])
        r = 1.0 / sqrt32(total / N + torch.tensor(eps, dtype=torch.float32))
        y = r[:, None] * xf
        if w is not None:
            y = w.float() * y
        return y.to(x.dtype).view(x.shape)

    for dt in (torch.float32, torch.bfloat16):
        exact = dt == torch.float32
        # rms_norm (fused form, F.rms_norm on CUDA)
        for shape in [(3, 5120), (2, 3, 128), (4, 3072), (2, 2, 520)]:
            x = (torch.randn(*shape) * 2).to(torch.bfloat16).to(dt)   # bf16 values: x * x exact
            n = shape[-1]
            for w, eps in ((None, None), (torch.randn(n).to(torch.bfloat16).to(dt), 1e-6)):
                assert trms.supported_layout(x, w, eps, "fused"), shape
                got = trms.rms_norm(x, w, eps, "fused")
                check(got, cuda_order_fused(x, w, 2.0 ** -23 if eps is None else eps), exact)
        # rope: Flux-like [B, S, H, D] and heads-first views, both rotations
        # (head dims that fill a tile, leave its end idle, or give odd halves)
        for D, inter in itertools.product((16, 40, 6), (True, False)):
            x = torch.randn(2, 37, 3, D, dtype=dt)
            cos, sin = torch.randn(37, D), torch.randn(37, D)
            args = (x, cos[None, :, None], sin[None, :, None], inter)
            assert trope.supported_layout(*args)
            check(trope.rope(*args), rope_reference(*args), exact)
            args = (x.transpose(1, 2), cos[None, None], sin[None, None], inter)
            check(trope.rope(*args), rope_reference(*args), exact)
        x = torch.randn(2, 37, 3, 16, dtype=dt)
        cos, sin = torch.randn(37, 16), torch.randn(37, 16)
        # rope_complex (Qwen-Image): without contraction the product is plain fp32 arithmetic, so
        # it is exact against the same arithmetic in torch; the default contraction within a tolerance
        from sgdiff.kernels.rope_complex import rope_complex_reference
        freqs = torch.polar(torch.rand(37, 8) + 0.5, torch.randn(37, 8))[:, None]     # [S, 1, D/2], as Qwen's unsqueeze(1)
        assert trope.supported_layout_complex(x, freqs)
        a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        c, d = freqs.real, freqs.imag
        plain = torch.stack([a * c - b * d, a * d + b * c], -1).flatten(-2).to(dt)
        check(trope.rope_complex(x, freqs, complex_fma=0), plain, exact)
        check(trope.rope_complex(x, freqs), rope_complex_reference(x, freqs), False)
        args = (x, cos[None, :, None, 0::2], sin[None, :, None, 1::2])
        assert trope.supported_layout_even_odd(*args)
        check(trope.rope_even_odd(*args), rope_even_odd_reference(*args), exact)
        # rms_norm (diffusers form): the kernel's order is ATen's CUDA order
        for shape in [(2, 7, 3, 128), (40, 64), (16, 3, 48), (3, 11, 256), (20, 1000), (17, 3072)]:
            x = torch.randn(*shape, dtype=dt) * 2
            n = shape[-1]
            for w in (None, torch.randn(n, dtype=torch.bfloat16), torch.randn(n)):
                assert trms.supported_layout(x, w, 1e-6, "diffusers"), shape
                got = trms.rms_norm(x, w, 1e-6, "diffusers")
                check(got, cuda_order_rms(x, w, 1e-6).as_strided(got.shape, got.stride()), exact and (w is None or w.dtype == torch.float32))
                check(got, rms_norm_reference(x, w, 1e-6, "diffusers"), False)   # CPU eager: another order
        xt = torch.randn(2, 40, 3, 64, dtype=dt).transpose(1, 2)
        check(trms.rms_norm(xt, None, 1e-6, "diffusers"), rms_norm_reference(xt, None, 1e-6, "diffusers"), False)
        # silu_mul: projection halves and channels-last chunks (numpy's exp is not CUDA's: a tolerance)
        a, b = (torch.randn(2, 7, 2 * 300, dtype=dt) * 4).chunk(2, -1)
        check(tsilu.silu_mul(a, b), silu_mul_reference(a, b), False)
        c = torch.randn(2, 8, 5, 6, dtype=dt).to(memory_format=torch.channels_last)
        hidden, gate = c.chunk(2, 1)
        check(tsilu.silu_mul(gate, hidden), silu_mul_reference(gate, hidden), False)
        # a biased convolution's epilogue: the bias (rounded as ATen's add_), then the SiLU or the GLU
        y, bias = torch.randn(2, 8, 5, 6, dtype=dt).to(memory_format=torch.channels_last), torch.randn(8, dtype=dt) * 4
        yb = y + bias.view(-1, 1, 1)
        hidden, gate = yb.chunk(2, 1)
        check(tsilu.bias_silu_mul_bind(y, bias)(y, bias), silu_mul_reference(gate, hidden), False, tol=2 ** -4)  # 3 roundings
        check(tsilu.bias_silu_bind(y, bias)(y, bias), F.silu(yb), False)   # in place, into y
        # cast_copy: Sana's linear-attention operands, read through their views (nothing rounds)
        proj = torch.randn(2, 37, 3 * 8, dtype=dt)
        proj[0, 0, :2] = float("nan")
        q = proj.transpose(1, 2).unflatten(1, (3, -1))                  # [B, H, D, N], D contiguous
        for x, relu, pad, contiguous in ((q, True, [], True), (q.transpose(2, 3), True, [], True),
                                         (q, True, [], False), (q, False, [0, 0, 0, 1], True)):
            args = (x, torch.float32, relu, pad, 1.0, contiguous)
            assert tcast.supported_layout(*args)
            got, want = tcast.cast_copy(*args), cast_copy_reference(*args)
            assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()   # NaN passes the ReLU
            check(got.nan_to_num(7.0), want.nan_to_num(7.0), True)
        # linear_attention_out: fp32 out is exact (an fp32 sum, an IEEE division); dt with its rounding.
        # 37 tokens leave partial tiles, 64 whole ones (no masks)
        for tokens in (37, 64):
            h = torch.randn(2, 3, 9, tokens) * 3
            for out_dtype in (torch.float32, dt):
                assert tlao.supported_layout(h, 1e-15, out_dtype)
                check(tlao.linear_attention_out(h, 1e-15, out_dtype),
                      linear_attention_out_reference(h, 1e-15, out_dtype), out_dtype == torch.float32)
        # modulate: x * (1 + scale) + shift over broadcast table rows and projection chunks
        xm = torch.randn(2, 7, 40, dtype=dt)
        emb = torch.randn(2, 6 * 40, dtype=dt).chunk(6, dim=1)
        for scale, shift in ((emb[1][:, None], emb[0][:, None]), (torch.randn(2, 1, 40), None),
                             (torch.randn(40, dtype=dt), torch.randn(2, 7, 40))):
            assert tmod.supported_layout(xm, scale, shift)
            check(tmod.modulate(xm, scale, shift), modulate_reference(xm, scale, shift), dt == torch.float32)
        # rmsnorm_modulate: against the chain (the norm's reduction order is CUDA's: a tolerance), and
        # exactly the norm's kernel then the modulate kernel (the interpreter rounds alike in both):
        # one pass rounds the norm's output where the two kernels store it, over table rows,
        # per-token projections, an fp32 scale over a half stream, scale-only, and an fp32 weight
        # (the diffusers norm's output then fp32); rows of 448: 3.5 of the diffusers form's chunks
        xr, (shift, scale) = torch.randn(2, 7, 128, dtype=dt), torch.randn(2, 1, 2 * 128, dtype=dt).chunk(2, -1)
        for w, eps, form in ((torch.randn(128, dtype=dt), 1e-6, "diffusers"), (None, None, "fused")):
            args = (xr, w, eps, form, scale, shift)
            assert trmod.supported_layout(*args)
            check(trmod.rmsnorm_modulate(*args), rmsnorm_modulate_reference(*args), False, tol=2 ** -4)  # 4 roundings
        xr = torch.randn(2, 40, 448, dtype=dt) * 3  # 80 rows: ATen's mean then takes a warp a row
        tok_scale, tok_shift = torch.randn(2, 40, 2 * 448, dtype=dt).chunk(2, -1)
        table = torch.randn(2, 6, 448, dtype=dt).chunk(6, dim=1)
        for w, eps, form in ((torch.randn(448, dtype=dt), 1e-6, "diffusers"), (torch.randn(448), 1e-6, "diffusers"),
                             (None, None, "fused"), (torch.randn(448, dtype=dt), 1e-5, "fused")):
            for scale, shift in ((table[1], table[0]), (tok_scale, tok_shift), (torch.randn(2, 1, 448), table[0]),
                                 (table[1], None)):
                args = (xr, w, eps, form, scale, shift)
                assert trmod.supported_layout(*args)
                check(trmod.rmsnorm_modulate(*args), tmod.modulate(trms.rms_norm(xr, w, eps, form), scale, shift), True)
        # rms_norm_rope: the fused norm then the rotation on one tile, equal to the two kernels
        # one after the other (the interpreter rounds alike in both), per-head and heads-first
        x = (torch.randn(2, 37, 3, 128) * 2).to(dt)
        cos, sin = torch.randn(37, 128), torch.randn(37, 128)
        for xx, c, s in ((x, cos[None, :, None], sin[None, :, None]), (x.transpose(1, 2), cos[None, None], sin[None, None])):
            for w, eps, inter in ((torch.randn(128).to(dt), 1e-6, True), (None, None, False)):
                args = (xx, w, eps, "fused", c, s, inter)
                assert trr.supported_layout(*args)
                check(trr.rms_norm_rope(*args), trope.rope(trms.rms_norm(xx, w, eps, "fused"), c, s, inter), True)
        # rms_norm_cat_rope: text and image rows, each normalized with its own weight, then joined
        xt, xi = (torch.randn(2, 7, 3, 128) * 2).to(dt), (torch.randn(2, 30, 384) * 2).to(dt).unflatten(-1, (3, 128))
        for w0, w1, eps, inter in ((torch.randn(128).to(dt), torch.randn(128).to(dt), 1e-6, True), (None, None, None, False)):
            args = (xt, w0, xi, w1, eps, "fused", cos[None, :, None], sin[None, :, None], inter)
            assert trr.supported_layout_cat(*args)
            joined = torch.cat([trms.rms_norm(xt, w0, eps, "fused"), trms.rms_norm(xi, w1, eps, "fused")], 1)
            check(trr.rms_norm_cat_rope(*args), trope.rope(joined, cos[None, :, None], sin[None, :, None], inter), True)
        assert not trr.supported_layout_cat(xt, None, xi[:, :, :2], None, None, "fused", cos[None, :, None],
                                            sin[None, :, None], True)                                  # other heads
        assert not trr.supported_layout(torch.randn(2, 3, 64), None, None, "fused", cos[:3, :64], sin[:3, :64], True)
        assert not trr.supported_layout(x, None, 1e-6, "diffusers", cos[None, :, None], sin[None, :, None], True)
        # gelu_tanh_cat: Flux's attention output (a transposed view) beside the MLP half; a
        # width that is not a block multiple; one row; blocks of head columns only (numpy's tanh is not CUDA's: a tolerance)
        attn = torch.randn(2, 3, 9, 16, dtype=dt).transpose(1, 2).flatten(2, 3)
        for head, x in [(attn, torch.randn(2, 9, 200, dtype=dt) * 3), (torch.randn(5, 7, dtype=dt), torch.randn(5, 1100, dtype=dt)),
                        (torch.randn(3, dtype=dt), torch.randn(6, dtype=dt)),
                        (torch.randn(4, 300, dtype=dt), torch.randn(4, 40, dtype=dt))]:   # head-only blocks
            assert tgelu.supported_layout(head, x)
            got = tgelu.gelu_tanh_cat(head, x)
            check(got, gelu_tanh_cat_reference(head, x), False)
            assert torch.equal(got[..., :head.shape[-1]], head)   # the copied part is exact
    # refused: eager takes another ATen path or the tables are not fp32 math
    assert not trms.supported_layout(torch.randn(4, 130), None, 1e-6, "diffusers")       # N % 4 at N >= 128
    assert not trms.supported_layout(torch.randn(1, 64), None, 1e-6, "diffusers")        # block.x widens
    assert not trms.supported_layout(torch.randn(64, 16), None, 1e-6, "diffusers")       # N < 32
    assert not trms.supported_layout(torch.randn(4, 130), None, 1e-6, "fused")            # Welford fallback
    assert not trms.supported_layout(torch.randn(4 * 128 + 1)[1:].view(4, 128), None, 1e-6, "fused")  # misaligned
    assert not trms.supported_layout(torch.randn(4, 128), torch.randn(128, dtype=torch.bfloat16), 1e-6, "fused")
    assert not tgelu.supported_layout(torch.randn(2, 3, 4), torch.randn(2, 4, 4))               # other rows
    assert not tgelu.supported_layout(torch.randn(2, 3, 4), torch.randn(2, 3, 4, dtype=torch.bfloat16))
    x = torch.randn(1, 4, 2, 16)
    assert not trope.supported_layout(x, torch.randn(4, 16, dtype=torch.float64)[None, :, None], x, True)
    assert not trope.supported_layout(x, torch.randn(5, 16)[None, :, None], x, True)      # wrong broadcast
    print("ok", cases)
""")


@pytest.mark.parametrize("script,cases", [(SCRIPT, 70), (RESIDUAL_GATE, 43), (ROWWISE, 206)],
                         ids=["layernorm_modulate", "residual_gate", "rowwise"])
def test_kernels_under_interpreter(script, cases):
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(cases)]  # every case ran


BINDS = textwrap.dedent(r"""
    # every Triton kernel's bind: a launch bound to one signature, called again with other tensors
    # of that geometry, gives what the kernel's own call gives on them (it reads the call's tensors,
    # not the bind's, and writes a fresh output each call)
    import torch
    from sgdiff.kernels import registry
    torch.manual_seed(0)
    cos, sin = torch.randn(37, 128), torch.randn(37, 128)

    def args(op):
        r = lambda *shape: torch.randn(*shape) * 2
        x4 = r(2, 37, 3, 128)
        return {
            "layernorm_modulate": lambda: (r(2, 5, 520), r(520), r(520), 1e-6, r(2, 1, 520), r(2, 1, 520), True),
            "layer_norm": lambda: (r(2, 5, 3, 64), r(64), r(64), 1e-5),
            "residual_gate": lambda: (r(2, 9, 40), r(2, 1, 40), r(2, 9, 40), False),
            "residual_add": lambda: (r(2, 9, 40), r(2, 9, 40), 2.0, False),
            "modulate": lambda: (r(2, 7, 40), r(2, 1, 40), r(2, 7, 40)),
            "rms_norm": lambda: (r(2, 7, 3, 128), r(128), 1e-6, "fused"),
            "rope": lambda: (x4, r(37, 128)[None, :, None], r(37, 128)[None, :, None], True),
            "rope_even_odd": lambda: (x4, r(37, 64)[None, :, None], r(37, 64)[None, :, None]),
            "rope_complex": lambda: (x4, torch.polar(torch.rand(37, 64) + 0.5, torch.randn(37, 64))[:, None]),
            "gelu_tanh_cat": lambda: (r(4, 300), r(4, 40)),
            "rms_norm_rope": lambda: (x4, r(128), 1e-6, "fused", cos[None, :, None], sin[None, :, None], True),
            "rms_norm_cat_rope": lambda: (r(2, 7, 3, 128), r(128), r(2, 30, 3, 128), r(128), 1e-6, "fused",
                                          cos[None, :, None], sin[None, :, None], False),
            "rmsnorm_modulate": lambda: (r(2, 7, 128), r(128), 1e-6, "diffusers", r(2, 1, 128), r(2, 1, 128)),
            "silu_mul": lambda: (r(2, 7, 300), r(2, 7, 300)),
            "cast_copy": lambda: (r(2, 3, 8, 37), torch.float32, True, [0, 0, 0, 1], 1.0, True),
            "linear_attention_out": lambda: (r(2, 3, 9, 37), 1e-15, torch.float32),
        }[op]

    def bits(t):
        return t.contiguous().view(torch.int32)

    bound = set()
    for op in sorted(o.name for o in registry.ops() if any(s.backend == "triton" for s in registry.kernel_specs(o.name))):
        if op.startswith("conv_"):
            continue   # their bind is an epilogue's on a convolution's output: tests/test_triton_interpreter ROWWISE
        fn = next(s for s in registry.kernel_specs(op) if s.backend == "triton").load()
        first, other = args(op)(), args(op)()
        launch = fn.bind(*first)
        a = launch(*other)
        b = launch(*other)
        assert a.data_ptr() != b.data_ptr(), op
        assert torch.equal(bits(a), bits(fn(*other))), op
        assert torch.equal(bits(launch(*first)), bits(fn(*first))), op
        bound.add(op)
    print("ok", len(bound))
""")


@pytest.mark.parametrize("script,cases", [(BINDS, 16)], ids=["binds"])
def test_binds_under_interpreter(script, cases):
    test_kernels_under_interpreter(script, cases)


POW2_COMBINE = textwrap.dedent(r"""
    import torch, triton, triton.language as tl
    from sgdiff.kernels.triton.welford import welford_combine, welford_combine_pow2

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
    print("ok", size)
""")


def test_power_of_two_reciprocal_from_bits_is_ieee_division():
    """welford_combine_pow2 (1 / count from the count's bits) against welford_combine (IEEE
    division) on counts whose sums are 0 or powers of two up to 2**21, equal and empty
    partners, means from 1e-30 to 1e30 with zeros, inf, NaN and subnormals: the same bits."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", POW2_COMBINE], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    assert words[0] == "ok" and int(words[1]) >= 256, out.stdout
