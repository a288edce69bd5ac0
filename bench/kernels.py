"""Kernel benchmark: each sgdiff op at real DiT shapes, against eager, Inductor and a copy.

    python bench/kernels.py [--out bench/results] [--ops layernorm_modulate,...] [--quick]
    python bench/kernels.py --merge RUN.json ...    # fold partial runs into --out's results
    python bench/kernels.py --across RUN.json ...   # sgdiff against Inductor and a copy over several runs

For every case, in one run: GPU time (CUDA-graph replays, alternating) of the eager chain, of
``torch.compile`` (default Inductor) on the same chain, of the sgdiff kernel, and of a copy of
the same bytes; wall time per call of eager and of sgdiff through its op; bit-exactness of the
sgdiff output (``torch.equal`` with eager). Writes kernels.json, kernels.md and kernels.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.timing import gpu_times, wall_us  # noqa: E402

COPY_BAR = 1.5  # a kernel should take at most this many times a copy of the bytes it moves


@dataclasses.dataclass
class Case:
    op: str
    shape: tuple
    dtype: torch.dtype
    note: str
    eager: Callable[[], torch.Tensor]  # the eager chain
    sgdiff_raw: Callable[[], torch.Tensor]  # the Triton launcher, called directly
    sgdiff_op: Callable[[], torch.Tensor]  # through torch.ops.sgdiff (dispatcher + checks)
    sgdiff_launcher: Callable[[], torch.Tensor]  # what a compiled graph with static shapes calls: a call site
    copy_src: torch.Tensor  # copying it moves as many bytes as the op must (read + write)
    # sgdiff's own kernel alone, where the op also runs another library's (a convolution's
    # epilogue on its output): what copy_src's bytes measure
    own_kernel: Optional[Callable[[], object]] = None


def _case(op_name: str, shape: tuple, dtype: torch.dtype, note: str, eager: Callable, args: tuple,
          copy_src: torch.Tensor, own_kernel: Optional[Callable] = None) -> Case:
    """A case whose sgdiff side is the op's Triton launcher, its registered op and a call site."""
    from sgdiff.kernels.dispatch import SiteLauncher
    from sgdiff.kernels.registry import kernel_specs, op_def

    kernel = next(s for s in kernel_specs(op_name) if s.backend == "triton").load()
    op = op_def(op_name).load()
    launch = SiteLauncher(op_name, tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)))
    return Case(op_name, shape, dtype, note, eager, lambda: kernel(*args), lambda: op(*args),
                lambda: launch(*args), copy_src, own_kernel)


def _bytes_like(*tensors: torch.Tensor) -> torch.Tensor:
    """A buffer whose copy moves as many bytes as reading and writing ``tensors`` once."""
    moved = sum(t.numel() * t.element_size() for t in tensors)
    return torch.empty(moved // 8, dtype=torch.float32, device="cuda")


def _modulated_params(B, S, N, dtype, form, g):
    if form == "chunk":  # Flux/SD3: emb -> linear -> [B, 6N] -> chunk -> [:, None]
        emb = torch.randn(B, 6 * N, device="cuda", generator=g).to(dtype)
        shift, scale = emb.chunk(6, dim=1)[:2]
        return scale[:, None], shift[:, None]
    if form == "table":  # Sana/PixArt: (table[None] + temb.reshape(B, 6, N)).chunk(6, dim=1)
        mod = torch.randn(B, 6, N, device="cuda", generator=g).to(dtype)
        shift, scale = mod.chunk(6, dim=1)[:2]
        return scale, shift
    if form == "per_token":
        proj = torch.randn(B, S, 2 * N, device="cuda", generator=g).to(dtype)
        return proj.chunk(2, dim=-1)
    raise ValueError(form)


def layernorm_modulate_cases(quick: bool) -> List[Case]:
    shapes = [((2, 1024, 2240), "Sana 1.6B", "table"), ((2, 4096, 1152), "PixArt-Sigma", "table"),
              ((1, 4608, 3072), "Flux.1-dev", "chunk"), ((1, 32760, 5120), "Wan 2.1 14B", "table")]
    if quick:
        shapes = shapes[:1]
    cases = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for (B, S, N), model, form in shapes:
        dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if "Wan" in model else [])
        for dtype in dtypes:
            for affine in (False, True):
                if affine and dtype != torch.bfloat16:
                    continue
                x = (torch.randn(B, S, N, device="cuda", generator=g) * 2 + 0.5).to(dtype)
                scale, shift = _modulated_params(B, S, N, dtype, form, g)
                w = torch.randn(N, device="cuda", generator=g).to(dtype) if affine else None
                b = torch.randn(N, device="cuda", generator=g).to(dtype) if affine else None
                args = (x, w, b, 1e-6, scale, shift, True)

                def eager(x=x, w=w, b=b, scale=scale, shift=shift):
                    return F.layer_norm(x, x.shape[-1:], w, b, 1e-6) * (1 + scale) + shift

                cases.append(_case("layernorm_modulate", (B, S, N), dtype,
                                   f"{model}, {form} params" + (", affine LN" if affine else ""),
                                   eager, args, x))
    # Wan 2.1 1.3B as its blocks write it: an fp32 chain between casts, fp32 table + temb parameters
    x = (torch.randn(1, 32760, 1536, device="cuda", generator=g) * 2 + 0.5).to(torch.bfloat16)
    scale, shift = _modulated_params(1, 32760, 1536, torch.float32, "table", g)
    cases.append(_case("layernorm_modulate", tuple(x.shape), x.dtype,
                       "Wan 2.1 1.3B: (norm(x.float()) * (1 + scale) + shift).type_as(x)",
                       lambda x=x, scale=scale, shift=shift: (F.layer_norm(x.float(), (1536,), eps=1e-6) * (1 + scale)
                                                              + shift).type_as(x),
                       (x, None, None, 1e-6, scale, shift, True, torch.float32, x.dtype), x))
    return cases


def residual_gate_cases(quick: bool) -> List[Case]:
    shapes = [((2, 1024, 2240), "Sana 1.6B"), ((2, 4096, 1152), "PixArt-Sigma"),
              ((1, 4608, 3072), "Flux.1-dev"), ((1, 32760, 5120), "Wan 2.1 14B")]
    if quick:
        shapes = shapes[:1]
    cases = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for (B, S, N), model in shapes:
        wan = "Wan" in model
        forms = [(torch.bfloat16, torch.bfloat16, "gate [B,1,D] chunk")]
        if wan:  # Wan keeps the residual stream and the gates in fp32; the update is bf16
            forms.append((torch.float32, torch.bfloat16, "fp32 stream and gate, bf16 update"))
        for stream, upd_dtype, note in forms:
            res = torch.randn(B, S, N, device="cuda", generator=g).to(stream)
            gate = torch.randn(B, 6 * N, device="cuda", generator=g).to(stream).chunk(6, dim=1)[2][:, None]
            upd = torch.randn(B, S, N, device="cuda", generator=g).to(upd_dtype)

            def eager(res=res, gate=gate, upd=upd):
                return res + gate * upd

            cases.append(_case("residual_gate", (B, S, N), stream, f"{model}, {note}", eager,
                               (res, gate, upd, False), _bytes_like(res, upd, res)))  # out is like res
    # the cross-attention's update divided by rescale_output_factor, ungated (Sana, PixArt) and
    # gated (PixArt's self-attention), against eager's two or three kernels
    res, upd = (torch.randn(2, 1024, 2240, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    gate = torch.randn(2, 6 * 2240, device="cuda", generator=g).to(torch.bfloat16).chunk(6, dim=1)[2][:, None]
    cases.append(_case("residual_add", tuple(res.shape), res.dtype, "Sana 1.6B cross-attention: attn / 1.0 + x",
                       lambda res=res, upd=upd: upd / 1.0 + res, (res, upd, 1.0, True), _bytes_like(res, upd, res)))
    cases.append(_case("residual_gate", tuple(res.shape), res.dtype, "self-attention: x + g * (attn / 1.0)",
                       lambda res=res, gate=gate, upd=upd: res + gate * (upd / 1.0),
                       (res, gate, upd, False, True, None, 1.0),
                       _bytes_like(res, upd, res)))
    # Wan 2.1 1.3B's blocks: (x.float() + y.float() * gate).type_as(x), gate an fp32 chunk
    # (the lambdas bind their tensors now: the names are taken again below)
    res, upd = (torch.randn(1, 32760, 1536, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    gate = torch.randn(1, 6, 1536, device="cuda", generator=g).chunk(6, dim=1)[2]
    cases.append(_case("residual_gate", tuple(res.shape), res.dtype,
                       "Wan 2.1 1.3B: (x.float() + y.float() * gate).type_as(x)",
                       lambda res=res, gate=gate, upd=upd: (res.float() + upd.float() * gate).type_as(res),
                       (res, gate, upd, False, True, None, None, res.dtype), _bytes_like(res, upd, res)))
    return cases


def rope_cases(quick: bool) -> List[Case]:
    """diffusers ``apply_rotary_emb`` (use_real) on Flux's q, and Wan's even/odd RoPE."""
    from diffusers.models.embeddings import apply_rotary_emb

    g = torch.Generator(device="cuda").manual_seed(2)
    cases = []
    B, S, H, D = 1, 4608, 24, 128  # Flux.1-dev q/k after the QK norm: [B, S, H, D]
    x = torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.bfloat16)
    cos, sin = (torch.randn(S, D, device="cuda", generator=g) for _ in range(2))
    for interleaved in ((True,) if quick else (True, False)):
        def eager(x=x, interleaved=interleaved):
            return apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=-1 if interleaved else -2, sequence_dim=1)

        cases.append(_case("rope", (B, S, H, D), x.dtype,
                           "Flux.1-dev q, " + ("interleaved" if interleaved else "rotate-half"),
                           eager, (x, cos[None, :, None], sin[None, :, None], interleaved), _bytes_like(x, x)))
    if not quick:
        B, S, H, D = 1, 32760, 12, 128  # Wan 2.1 1.3B, 480p x 81 frames
        x = torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.bfloat16)
        fcos, fsin = (torch.randn(1, S, 1, D, device="cuda", generator=g) for _ in range(2))

        def wan(x=x, fcos=fcos, fsin=fsin):  # WanAttnProcessor's apply_rotary_emb
            x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
            cos, sin = fcos[..., 0::2], fsin[..., 1::2]
            out = torch.empty_like(x)
            out[..., 0::2] = x1 * cos - x2 * sin
            out[..., 1::2] = x1 * sin + x2 * cos
            return out.type_as(x)

        cases.append(_case("rope_even_odd", (B, S, H, D), x.dtype, "Wan 2.1 1.3B q, fp32 tables", wan,
                           (x, fcos[..., 0::2], fsin[..., 1::2]), _bytes_like(x, x)))
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        B, S, H, D = 1, 4096, 24, 128  # Qwen-Image q at 1024², its image tokens' complex table
        x = torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.bfloat16)
        freqs = torch.polar(torch.ones(S, D // 2, device="cuda"), torch.randn(S, D // 2, device="cuda", generator=g))
        cases.append(_case("rope_complex", (B, S, H, D), x.dtype, "Qwen-Image q, complex table (use_real=False)",
                           lambda x=x, freqs=freqs: apply_rotary_emb_qwen(x, freqs, use_real=False),
                           (x, freqs.unsqueeze(1)), _bytes_like(x, x)))
    return cases


def rms_norm_cases(quick: bool) -> List[Case]:
    """QK norms: diffusers' hand-written RMSNorm form, and F.rms_norm (fused) per head and across heads."""
    from diffusers.models.normalization import RMSNorm

    g = torch.Generator(device="cuda").manual_seed(3)
    shapes = [((1, 4608, 24, 128), "[B, S, H, D], diffusers form", False),
              ((2, 4096, 38, 64), "[B, H, S, D] view (SD3.5-large), diffusers form", True)]
    cases = []
    for (B, S, H, D), note, transposed in shapes[:1] if quick else shapes:
        x = torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.bfloat16)
        if transposed:
            x = x.transpose(1, 2)
        norm = RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(D, generator=g, device="cuda"))
        args = (x, norm.weight.detach(), 1e-6, "diffusers")
        cases.append(_case("rms_norm", tuple(x.shape), x.dtype, note, lambda x=x, norm=norm: norm(x),
                           args, _bytes_like(x, x)))
    # F.rms_norm -> aten._fused_rms_norm: Flux's QK norm per head (diffusers >= 0.35 calls
    # F.rms_norm), Wan's across heads
    for shape, model in (((1, 4608, 24, 128), "Flux.1-dev q per head"), ((1, 32760, 1536), "Wan 2.1 1.3B q across heads"),
                         ((1, 32760, 5120), "Wan 2.1 14B q across heads"))[:1 if quick else 3]:
        D = shape[-1]
        x = torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)
        norm = torch.nn.RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(D, generator=g, device="cuda"))
        cases.append(_case("rms_norm", tuple(x.shape), x.dtype, f"{model} (F.rms_norm, fused)",
                           lambda x=x, norm=norm: norm(x), (x, norm.weight.detach(), 1e-6, "fused"),
                           _bytes_like(x, x)))
    return cases


def silu_mul_cases(quick: bool) -> List[Case]:
    """Sana's GLUMBConv gate (channels-last halves of a depthwise conv) and a SwiGLU."""
    g = torch.Generator(device="cuda").manual_seed(4)
    cases = []
    conv = torch.randn(2, 11200, 32, 32, device="cuda", generator=g).to(torch.bfloat16)
    conv = conv.to(memory_format=torch.channels_last)
    hidden, gate = conv.chunk(2, dim=1)
    cases.append(_case("silu_mul", tuple(hidden.shape), conv.dtype, "Sana 1.6B GLU, channels-last chunks",
                       lambda: hidden * F.silu(gate), (gate, hidden), _bytes_like(hidden, gate, hidden)))
    if not quick:
        proj = torch.randn(1, 4608, 2 * 12288, device="cuda", generator=g).to(torch.bfloat16)
        a, b = proj.chunk(2, dim=-1)
        cases.append(_case("silu_mul", tuple(a.shape), proj.dtype, "SwiGLU halves of a projection",
                           lambda: F.silu(a) * b, (a, b), _bytes_like(a, b, a)))
    return cases


def rms_norm_rope_cases(quick: bool) -> List[Case]:
    """Flux single blocks: F.rms_norm over head_dim (fused on CUDA), then apply_rotary_emb."""
    from diffusers.models.embeddings import apply_rotary_emb

    g = torch.Generator(device="cuda").manual_seed(6)
    B, S, H, D = 1, 4608, 24, 128
    x = torch.randn(B, S, H * D, device="cuda", generator=g).to(torch.bfloat16).unflatten(-1, (H, D))
    norm = torch.nn.RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)
    cos, sin = (torch.randn(S, D, device="cuda", generator=g) for _ in range(2))

    def eager():
        return apply_rotary_emb(norm(x), (cos, sin), sequence_dim=1)

    args = (x, norm.weight.detach(), 1e-6, "fused", cos[None, :, None], sin[None, :, None], True)
    cases = [_case("rms_norm_rope", (B, S, H, D), x.dtype, "Flux.1-dev q, single block (QK norm + RoPE)",
                   eager, args, _bytes_like(x, x))]
    txt, img = x[:, :512], x[:, 512:]  # double blocks: text and image queries normalized apart, then joined
    norm_added = torch.nn.RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)

    def joined():
        return apply_rotary_emb(torch.cat([norm_added(txt), norm(img)], dim=1), (cos, sin), sequence_dim=1)

    args = (txt, norm_added.weight.detach(), img, norm.weight.detach(), 1e-6, "fused", cos[None, :, None],
            sin[None, :, None], True)
    cases.append(_case("rms_norm_cat_rope", (B, S, H, D), x.dtype, "Flux.1-dev q, double block (2 QK norms, cat, RoPE)",
                       joined, args, _bytes_like(x, x)))
    return cases


def gelu_tanh_cat_cases(quick: bool) -> List[Case]:
    """Flux single blocks: cat([attention output, gelu_tanh(proj_mlp(x))], dim=2) before proj_out."""
    g = torch.Generator(device="cuda").manual_seed(5)
    attn = torch.randn(1, 24, 4608, 128, device="cuda", generator=g).to(torch.bfloat16)
    head = attn.transpose(1, 2).flatten(2, 3)  # SDPA's output laid out [B, S, H, D]: a view
    x = (torch.randn(1, 4608, 12288, device="cuda", generator=g) * 3).to(torch.bfloat16)
    eager = lambda: torch.cat([head, F.gelu(x, approximate="tanh")], dim=2)  # noqa: E731
    return [_case("gelu_tanh_cat", (1, 4608, 3072 + 12288), x.dtype, "Flux.1-dev single block, attention + MLP",
                  eager, (head, x), _bytes_like(head, x, head, x))]


def conv_epilogue_cases(quick: bool) -> List[Case]:
    """Sana 1.6B GLUMBConv: conv_inverted (1x1, 2240 -> 11200) + SiLU, conv_depth (3x3 depthwise) + GLU.
    Every column includes the convolution (the same kernel in each: for the 1x1, a cuBLAS GEMM);
    copy moves the epilogue's bytes (the convolution's output read and the activation written),
    and kernel_us times sgdiff's epilogue alone on a bias-free convolution output."""
    from sgdiff.kernels.triton.silu_mul import bias_silu_bind, bias_silu_mul_bind

    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(2, 1024, 2240, device="cuda", generator=g).to(torch.bfloat16).unflatten(1, (32, 32))
    x = x.permute(0, 3, 1, 2)  # Sana's block: tokens unflattened to a channels-last NCHW view
    w1 = (torch.randn(11200, 2240, 1, 1, device="cuda", generator=g) / 2240 ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(11200, 1, 3, 3, device="cuda", generator=g) / 3).to(torch.bfloat16)
    b1, b2 = (torch.randn(11200, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    h = F.silu(F.conv2d(x, w1, b1))

    def glu():
        a, gate = F.conv2d(h, w2, b2, padding=1, groups=11200).chunk(2, dim=1)
        return a * F.silu(gate)

    y1, y2 = F.conv2d(x, w1), F.conv2d(h, w2, padding=1, groups=11200)  # as the ops take them
    silu_epilogue, glu_epilogue = bias_silu_bind(y1, b1), bias_silu_mul_bind(y2, b2)  # the first in place

    return [_case("conv_silu", tuple(h.shape), h.dtype, "Sana 1.6B conv_inverted + SiLU (conv included)",
                  lambda: F.silu(F.conv2d(x, w1, b1)), (x, w1, b1, [1, 1], [0, 0], [1, 1], 1), _bytes_like(h, h),
                  lambda: silu_epilogue(y1, b1)),
            _case("conv_silu_mul", tuple(h.shape), h.dtype, "Sana 1.6B conv_depth + GLU (conv included)",
                  glu, (h, w2, b2, [1, 1], [1, 1], [1, 1], 11200), _bytes_like(h, h[:, :5600]),
                  lambda: glu_epilogue(y2, b2))]


def linear_attention_cases(quick: bool) -> List[Case]:
    """Sana 1.6B linear attention (batch 2, 1024 tokens, 70 heads of 32): ReLU(q).float() copied
    contiguous for the matmul, v.float() padded with a row of ones, and the output normalized by
    its last row and cast back."""
    g = torch.Generator(device="cuda").manual_seed(8)
    proj = torch.randn(2, 2, 1024, 2240, device="cuda", generator=g).to(torch.bfloat16)
    q, v = (p.transpose(1, 2).unflatten(1, (70, -1)) for p in proj)
    out = torch.randn(2, 70, 33, 1024, device="cuda", generator=g) * 50  # also the second matmul's output
    return [_case("cast_copy", tuple(q.shape), q.dtype, "Sana 1.6B q: relu, fp32, contiguous copy",
                  lambda: torch.relu(q).float().contiguous(), (q, torch.float32, True, [], 0.0, True),
                  _bytes_like(q, out[:, :, :32])),
            _case("cast_copy", tuple(v.shape), v.dtype, "Sana 1.6B v: fp32, a row of ones below",
                  lambda: F.pad(v.float(), (0, 0, 0, 1), value=1.0), (v, torch.float32, False, [0, 0, 0, 1], 1.0, True),
                  _bytes_like(v, out)),
            _case("linear_attention_out", tuple(out.shape), torch.bfloat16,
                  "Sana 1.6B output: / last row, heads joined, tokens first, bf16",
                  lambda: (lambda y: y.flatten(1, 2).transpose(1, 2).to(torch.bfloat16))(
                      out[:, :, :-1] / (out[:, :, -1:] + 1e-15)),
                  (out, 1e-15, torch.bfloat16), _bytes_like(out, q))]
def modulate_cases(quick: bool) -> List[Case]:
    """x * (1 + scale) + shift with no norm before it, at the LayerNorm-modulate shapes."""
    g = torch.Generator(device="cuda").manual_seed(9)
    shapes = [((2, 1024, 2240), "Sana 1.6B sized, table params", "table"),
              ((1, 4608, 3072), "Flux.1-dev sized, chunk params", "chunk")]
    cases = []
    for (B, S, N), note, form in shapes[:1] if quick else shapes:
        x = torch.randn(B, S, N, device="cuda", generator=g).to(torch.bfloat16)
        scale, shift = _modulated_params(B, S, N, x.dtype, form, g)
        cases.append(_case("modulate", (B, S, N), x.dtype, note, lambda x=x, scale=scale, shift=shift:
                           x * (1 + scale) + shift, (x, scale, shift), _bytes_like(x, x)))
    return cases


def rmsnorm_modulate_cases(quick: bool) -> List[Case]:
    """diffusers' RMSNorm, then the modulation: LTX-Video's blocks (no weight, table + temb
    rows unbound from one tensor) and Lumina-Image 2.0's (a weight, scale only, chunk params)."""
    from diffusers.models.normalization import RMSNorm

    g = torch.Generator(device="cuda").manual_seed(11)
    cases = []
    B, S, D = 2, 6144, 2048  # LTX-Video 2B, 768x512 x 121 frames, batch 2 (guidance)
    x = torch.randn(B, S, D, device="cuda", generator=g).to(torch.bfloat16)
    table = torch.randn(6, D, device="cuda", generator=g).to(x.dtype)
    temb = torch.randn(B, 1, 6 * D, device="cuda", generator=g).to(x.dtype)
    shift, scale = (table[None, None] + temb.reshape(B, 1, 6, -1)).unbind(dim=2)[:2]
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)
    cases.append(_case("rmsnorm_modulate", (B, S, D), x.dtype, "LTX-Video 2B: RMSNorm(x) * (1 + scale) + shift",
                       lambda: norm(x) * (1 + scale) + shift, (x, None, 1e-6, "diffusers", scale, shift), x))
    if not quick:
        B, S, D = 2, 4352, 2304  # Lumina-Image 2.0 at 1024²: 4096 image and 256 caption tokens, batch 2
        y = torch.randn(B, S, D, device="cuda", generator=g).to(torch.bfloat16)
        lnorm = RMSNorm(D, eps=1e-5).to("cuda", torch.bfloat16)
        with torch.no_grad():
            lnorm.weight.copy_(torch.randn(D, device="cuda", generator=g))
        scale_msa = torch.randn(B, 4 * D, device="cuda", generator=g).to(y.dtype).chunk(4, dim=1)[0]

        def lumina():
            with torch.no_grad():
                return lnorm(y) * (1 + scale_msa[:, None])

        cases.append(_case("rmsnorm_modulate", (B, S, D), y.dtype, "Lumina-Image 2.0: RMSNorm(x) * (1 + scale), affine",
                           lumina, (y, lnorm.weight.detach(), 1e-5, "diffusers", scale_msa[:, None], None), y))
    return cases


def layer_norm_cases(quick: bool) -> List[Case]:
    """A QK LayerNorm over head_dim (affine), q of a 24-head, 4608-token attention."""
    g = torch.Generator(device="cuda").manual_seed(10)
    x = torch.randn(1, 4608, 24 * 128, device="cuda", generator=g).to(torch.bfloat16).unflatten(-1, (24, 128))
    w, b = (torch.randn(128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    h = torch.randn(1, 32760, 1536, device="cuda", generator=g).to(torch.bfloat16)
    w32, b32 = (torch.randn(1536, device="cuda", generator=g) for _ in range(2))
    return [_case("layer_norm", tuple(x.shape), x.dtype, "q per head, affine (F.layer_norm over head_dim)",
                  lambda: F.layer_norm(x, (128,), w, b, 1e-6), (x, w, b, 1e-6), _bytes_like(x, x)),
            _case("layer_norm", tuple(h.shape), h.dtype, "Wan 2.1 1.3B cross-attention FP32LayerNorm, affine",
                  lambda: F.layer_norm(h.float(), (1536,), w32, b32, 1e-6).type_as(h),
                  (h, w32, b32, 1e-6, torch.float32, h.dtype), h)]


CASES: Dict[str, Callable[[bool], List[Case]]] = {
    "layernorm_modulate": layernorm_modulate_cases,
    "residual_gate": residual_gate_cases,
    "rope": rope_cases,
    "rms_norm": rms_norm_cases,
    "silu_mul": silu_mul_cases,
    "gelu_tanh_cat": gelu_tanh_cat_cases,
    "rms_norm_rope": rms_norm_rope_cases,
    "conv_epilogue": conv_epilogue_cases,
    "linear_attention": linear_attention_cases,
    "modulate": modulate_cases,
    "rmsnorm_modulate": rmsnorm_modulate_cases,
    "layer_norm": layer_norm_cases,
}


def _plain(fn):
    """``fn()`` with its kernels launched after the previous kernel ends (no programmatic
    dependent launch: nothing of the launch overlaps the kernel before)."""
    from sgdiff.kernels.triton.launch import plain_launches

    with plain_launches():
        return fn()


def measure(case: Case) -> dict:
    want = case.eager()
    got = case.sgdiff_raw()
    via_op = case.sgdiff_op()
    torch._dynamo.reset()  # each case's chain is its own compile, never a recompile of another's
    inductor_fn = torch.compile(case.eager)
    ind = inductor_fn()
    dst = torch.empty_like(case.copy_src)
    src_ints, dst_ints = _as_ints(case.copy_src), _as_ints(dst)
    nbytes = 2 * case.copy_src.numel() * case.copy_src.element_size()
    row = dict(
        op=case.op, shape=list(case.shape), dtype=str(case.dtype).removeprefix("torch."), note=case.note,
        bitexact=bool(torch.equal(got, want)), bitexact_via_op=bool(torch.equal(via_op, want)),
        mismatches=int((got != want).sum()),
        inductor_bitexact=bool(torch.equal(ind, want)),
        inductor_max_diff=float((ind.float() - want.float()).abs().max()),
        # Inductor's chain twice, each a graph of its own: how far one kernel's timings part (the noise floor)
        **gpu_times(dict(eager_us=case.eager, inductor_us=inductor_fn, inductor_again_us=inductor_fn,
                         sgdiff_us=case.sgdiff_raw,
                         sgdiff_plain_us=lambda: _plain(case.sgdiff_raw), copy_us=lambda: dst.copy_(case.copy_src),
                         copy_sm_us=lambda: torch.bitwise_or(src_ints, 0, out=dst_ints),
                         **({} if case.own_kernel is None else dict(kernel_us=case.own_kernel)))),
        **wall_us(dict(wall_eager_us=case.eager, wall_sgdiff_us=case.sgdiff_op, wall_sgdiff_raw_us=case.sgdiff_raw,
                       wall_sgdiff_launcher_us=case.sgdiff_launcher)),
        wall_sgdiff_via="call site",
    )
    row["copy_gbps"] = nbytes / _copy_us(row) / 1e3
    row["sgdiff_gbps"] = nbytes / _own_us(row) / 1e3
    return row


def _meta() -> dict:
    import triton

    commit = os.environ.get("SGDIFF_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, commit=commit or "unknown")


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _as_ints(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as integers of its element size: an elementwise op on them moves the bytes unchanged."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _copy_us(case: dict) -> float:
    """The copy that the bar is taken on: the faster of ``copy_`` (a memcpy node in the graph)
    and an elementwise kernel moving the same bytes on the SMs (``copy_sm_us``; runs before
    it was timed: the memcpy alone). A memcpy of 0.6-1 GB ran at 2.7 TB/s in some processes
    and at 4.2 in others on the H200; the kernel at 4.2 in both."""
    return min(case["copy_us"], case.get("copy_sm_us", float("inf")))


def _own_us(case: dict) -> float:
    """sgdiff's time that the copy bar is taken on: its own kernel's where the case times one (‡)."""
    return case.get("kernel_us", case["sgdiff_us"])


def _copy_ratio(case: dict) -> str:
    """sgdiff's time over a copy's, of its own kernel where the case times one (‡)."""
    ratio = f"{_own_us(case) / _copy_us(case):.2f}"
    return f"{ratio} ‡ ({case['kernel_us']:.1f})" if "kernel_us" in case else ratio


def write_report(result: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(result, indent=1))
    lines = [f"# sgdiff kernels on {result['gpu']}",
             f"torch {result['torch']}, triton {result['triton']}, commit {result['commit']}. "
             "GPU times in µs per call, the median of CUDA-graph replays that alternate between the ways, each "
             "after an untimed replay of its own (rows at 6b96321 and earlier: each way's replays in turn); "
             "wall = host time per call (the median of rounds that alternate between the ways; rows at fa815d7 "
             "and earlier: each way's rounds in turn), "
             "eager chain vs "
             "sgdiff as a compiled graph with static shapes calls it (a call site: an alignment lookup and a launch "
             "bound to the signature; † marks runs that timed the op launcher instead: a signature lookup and "
             "the launch) and through the registered op (torch.ops.sgdiff, dispatcher included). ‡: sgdiff/copy "
             "of sgdiff's own kernel alone (a convolution's epilogue on its output, in µs after the ratio); "
             "the other columns include the convolution. sgdiff's kernels are programmatic dependent launches on "
             "Hopper: a call's launch overlaps the end of the call before it (timed back to back: itself); "
             "'plain' times the same calls launched each after the last has ended, as eager's, Inductor's and "
             "the copy's are ('-': rows timed before c1ee777). copy: the faster of `copy_` (a memcpy in the graph) "
             "and an elementwise kernel moving the same bytes on the SMs, in the runs that timed both (`copy_sm_us` "
             "in kernels.json; before, the memcpy alone). 'Inductor again': the same compiled chain timed a second "
             "time, as a graph of its own, in the same replays: how far two timings of one kernel part ('-': rows "
             "timed before it was).", "",
             "| op | shape | dtype | case | bit-exact | sgdiff | sgdiff plain | eager | Inductor | Inductor again | "
             "copy | sgdiff/copy | wall sgdiff | wall sgdiff op | wall eager | commit |", "|" + " --- |" * 16]
    for c in result["cases"]:
        lines.append(f"| {c['op']} | {'×'.join(map(str, c['shape']))} | {c['dtype']} | {c['note']} | "
                     f"{'yes' if c['bitexact'] else 'NO (%d)' % c['mismatches']} | {c['sgdiff_us']:.1f} | "
                     f"{_us(c.get('sgdiff_plain_us'))} | {c['eager_us']:.1f} | {c['inductor_us']:.1f} | "
                     f"{_us(c.get('inductor_again_us'))} | {_copy_us(c):.1f} | "
                     f"{_copy_ratio(c)} | {c['wall_sgdiff_launcher_us']:.1f}{'' if c.get('wall_sgdiff_via') else ' †'} | "
                     f"{c['wall_sgdiff_us']:.1f} | {c['wall_eager_us']:.1f} | {c.get('commit', result['commit'])} |")
    (out / "kernels.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cases = result["cases"]
        labels = [f"{c['op']}\n{'×'.join(map(str, c['shape']))} {c['dtype']}" for c in cases]
        fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.9), 4.5))
        width = 0.2
        ways = dict(eager=lambda c: c["eager_us"], inductor=lambda c: c["inductor_us"], sgdiff=lambda c: c["sgdiff_us"],
                    copy=_copy_us)
        for i, (label, us) in enumerate(ways.items()):
            ax.bar([j + i * width for j in range(len(cases))], [us(c) / _copy_us(c) for c in cases], width, label=label)
        ax.set_xticks([j + 1.5 * width for j in range(len(cases))], labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("GPU time / copy of the same bytes")
        ax.axhline(COPY_BAR, color="gray", ls=":", lw=1)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "kernels.png", dpi=110)
    except ImportError:
        pass


def merge_cases(old: dict, new: dict, key: Callable[[dict], tuple], rank: Callable[[tuple], int]) -> dict:
    """Results ``old`` with the cases of ``new`` (a run of some of them) in place of the same
    cases (``key``), each case tagged with the commit it ran at, ordered by ``rank`` (stable)."""
    cases = {key(c): dict(c, commit=c.get("commit", old["commit"])) for c in old["cases"]}
    cases.update({key(c): dict(c, commit=c.get("commit", new["commit"])) for c in new["cases"]})
    return dict(new, cases=[cases[k] for k in sorted(cases, key=rank)])


def fold_runs(published: pathlib.Path, runs, merge: Callable[[dict, dict], dict], write: Callable) -> None:
    """Fold the result files ``runs`` (earliest first) into the results ``published`` (a JSON
    file) with ``merge``, and rewrite its report with ``write(results, folder)``."""
    merged = json.loads(published.read_text())
    for path in runs:
        merged = merge(merged, json.loads(pathlib.Path(path).read_text()))
    write(merged, published.parent)


def _case_key(case: dict) -> tuple:
    return case["op"], tuple(case["shape"]), case["dtype"], case["note"]


def merge_results(old: dict, new: dict) -> dict:
    """Kernel results: cases are (op, shape, dtype, note), in the order of :data:`CASES`."""
    family = {op: i for i, op in enumerate(CASES)}
    family.update(rms_norm_cat_rope=family["rms_norm_rope"], residual_add=family["residual_gate"], rope_even_odd=family["rope"], rope_complex=family["rope"],
                  conv_silu=family["conv_epilogue"], conv_silu_mul=family["conv_epilogue"],
                  cast_copy=family["linear_attention"], linear_attention_out=family["linear_attention"])
    return merge_cases(old, new, _case_key, lambda k: family.get(k[0], len(family)))


def _noise_floor(cases: List[dict]) -> dict:
    """Over the runs that timed Inductor's chain twice (``inductor_again_us``): the median gap
    between its two timings, and in how many of those runs sgdiff was above Inductor by no more
    than that run's gap (a difference one kernel shows against itself orders nothing)."""
    timed = [c for c in cases if c.get("inductor_again_us") is not None]
    gaps = [abs(c["inductor_again_us"] - c["inductor_us"]) for c in timed]
    return dict(noise_runs=len(timed), noise_median_us=statistics.median(gaps) if gaps else None,
                within_noise=sum(c["sgdiff_us"] - c["inductor_us"] <= gap for c, gap in zip(timed, gaps)))


def across_runs(runs: List[dict]) -> List[dict]:
    """The cases that ran in more than one of ``runs`` (kernel results, in the first run's order
    of cases): each run's GPU times, their medians, in how many runs sgdiff took no longer than
    Inductor and no longer than 1.5 copies of the same bytes, the same for sgdiff launched
    plainly (``sgdiff_plain_us``) in the runs that timed it, and Inductor against itself
    (:func:`_noise_floor`). Where two kernels tie at a roofline, one run cannot order them;
    several can say how often each way comes out ahead, and by how much more than noise."""
    seen: Dict[tuple, List[dict]] = {}
    for run in runs:
        for case in run["cases"]:
            seen.setdefault(_case_key(case), []).append(dict(case, commit=case.get("commit", run["commit"])))
    rows = []
    for key, cases in seen.items():
        if len(cases) < 2:
            continue
        sgdiff = [c["sgdiff_us"] for c in cases]
        inductor = [c["inductor_us"] for c in cases]
        to_copy = [_own_us(c) / _copy_us(c) for c in cases]
        plain = [c for c in cases if c.get("sgdiff_plain_us") is not None]
        # a ‡ case's plain time includes its convolution: its copy ratio is its own kernel's
        plain_to_copy = [(c["sgdiff_plain_us"] - c["sgdiff_us"] + _own_us(c)) / _copy_us(c) for c in plain]
        rows.append(dict(op=key[0], shape=list(key[1]), dtype=key[2], note=key[3], commits=[c["commit"] for c in cases],
                         sgdiff_us=sgdiff, inductor_us=inductor,
                         sgdiff_median_us=statistics.median(sgdiff), inductor_median_us=statistics.median(inductor),
                         at_or_below_inductor=sum(s <= i for s, i in zip(sgdiff, inductor)),
                         copy_ratio_median=statistics.median(to_copy),
                         within_copy_bar=sum(r <= COPY_BAR for r in to_copy),
                         plain_runs=len(plain),
                         plain_median_us=statistics.median(c["sgdiff_plain_us"] for c in plain) if plain else None,
                         plain_at_or_below_inductor=sum(c["sgdiff_plain_us"] <= c["inductor_us"] for c in plain),
                         plain_copy_ratio_median=statistics.median(plain_to_copy) if plain else None,
                         plain_within_copy_bar=sum(r <= COPY_BAR for r in plain_to_copy),
                         **_noise_floor(cases)))
    return rows


def write_across_runs(runs: List[dict], out: pathlib.Path) -> None:
    """``kernels-across-runs.md`` in ``out``: :func:`across_runs` as a table."""
    rows = across_runs(runs)
    lines = ["# sgdiff kernels against Inductor and a copy across runs",
             f"{runs[0]['gpu']}, torch {runs[0]['torch']}, triton {runs[0]['triton']}. The cases that ran in more "
             "than one of the runs below, each run in a process of its own; GPU times in µs as in `kernels.md`. "
             "/copy: sgdiff's time over a copy of the same bytes, each run's ratio (‡ cases: their own kernel's), "
             f"then the median; ≤ {COPY_BAR}x copy: in how many runs. 'plain': the same calls launched each after "
             "the last has ended, in the runs that timed them. Inductor against itself: in the runs that timed its "
             "chain twice (each a graph of its own, in the same replays), the median gap between the two timings, "
             "and in how many of them sgdiff was above Inductor by no more than that run's gap.",
             "", "Runs: " + ", ".join(f"{run['commit']} ({len(run['cases'])} cases)" for run in runs), "",
             "| op | shape | dtype | case | commits | sgdiff / Inductor, each run | median sgdiff | median Inductor | "
             f"runs with sgdiff ≤ Inductor | median /copy | runs ≤ {COPY_BAR}x copy | median plain | "
             f"plain runs ≤ Inductor | median plain /copy | plain runs ≤ {COPY_BAR}x copy | "
             "Inductor against itself, median gap | runs sgdiff ≤ Inductor + gap |", "|" + " --- |" * 17]
    for r in rows:
        # three decimals: at a tie the count turns on differences that two would round away
        pairs = ", ".join(f"{s:.3f} / {i:.3f}" for s, i in zip(r["sgdiff_us"], r["inductor_us"]))
        n, p = len(r["sgdiff_us"]), r["plain_runs"]
        plain = (f"{r['plain_median_us']:.3f} | {r['plain_at_or_below_inductor']} of {p} | "
                 f"{r['plain_copy_ratio_median']:.3f} | {r['plain_within_copy_bar']} of {p}") if p else "- | - | - | -"
        q = r["noise_runs"]
        noise = f"{r['noise_median_us']:.3f} | {r['within_noise']} of {q}" if q else "- | -"
        lines.append(f"| {r['op']} | {'×'.join(map(str, r['shape']))} | {r['dtype']} | {r['note']} | "
                     f"{', '.join(r['commits'])} | {pairs} | {r['sgdiff_median_us']:.3f} | "
                     f"{r['inductor_median_us']:.3f} | {r['at_or_below_inductor']} of {n} | "
                     f"{r['copy_ratio_median']:.3f} | {r['within_copy_bar']} of {n} | {plain} | {noise} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels-across-runs.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--ops", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="one shape per op")
    parser.add_argument("--merge", nargs="+", metavar="KERNELS_JSON",
                        help="no measuring: merge these results (earliest first) into --out's kernels.json")
    parser.add_argument("--across", nargs="+", metavar="KERNELS_JSON",
                        help="no measuring: compare sgdiff with Inductor and a copy over these runs (kernels-across-runs.md in --out)")
    args = parser.parse_args(argv)
    if args.across:
        write_across_runs([json.loads(pathlib.Path(p).read_text()) for p in args.across], pathlib.Path(args.out))
        return 0
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "kernels.json", args.merge, merge_results, write_report)
        return 0
    from tqdm import tqdm

    cases = [c for op in args.ops.split(",") for c in CASES[op](args.quick)]
    rows = []
    meta = _meta()
    for case in tqdm(cases, desc="kernels", file=sys.stdout):
        rows.append(measure(case))
        write_report(dict(meta, cases=rows), pathlib.Path(args.out))  # a cut-short run keeps its cases
        r = rows[-1]
        tqdm.write(f"{r['op']:<20} {str(r['shape']):<20} {r['dtype']:<9} exact={r['bitexact']} "
                   f"mism={r['mismatches']} sgdiff={r['sgdiff_us']:.1f} eager={r['eager_us']:.1f} "
                   f"ind={r['inductor_us']:.1f}/{r['inductor_again_us']:.1f} copy={_copy_us(r):.1f} "
                   f"wall={r['wall_sgdiff_us']:.1f}/"
                   f"{r['wall_eager_us']:.1f} launcher={r['wall_sgdiff_launcher_us']:.1f} raw={r['wall_sgdiff_raw_us']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
