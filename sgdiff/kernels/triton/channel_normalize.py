"""Triton sgdiff::channel_normalize: everything after the norm of ``F.normalize(x, dim=1)`` in
Wan's VAE RMS norm (+ SiLU), one pass, bitwise equal to eager on CUDA.

Eager's kernels, each rounding (fp32 math, ``T`` the input's dtype)::

    d = xf / max(norm, eps)          # clamp_min (NaN stays), then an IEEE division
    y = T(d)                         # .to(x.dtype)
    y = T(y * float(scale))          # * self.scale, a Python float taken as fp32 (or the fp32
                                     #   0-d host tensor a graph takes it as, read per launch)
    y = T(y * gamma[c])              # * self.gamma, per channel
    y = T(y + bias)                  # + self.bias: a per-channel tensor or a number (0.0)
    y = T(y / (1 + expf(-y)))        # nn.SiLU, where the block has one

The norm (``linalg_vector_norm`` over the channels) is ATen's own, computed before: its
reduction order is ATen's reduce kernel's. A program covers ``BLOCK_R`` rows (one channel of
one sample each) and ``BLOCK_S`` positions of one frame; the norm is read per position, gamma
and bias per row.

``x`` is read as ``[N, C, T, H*W]`` through its strides, each frame's ``H*W`` contiguous: a
contiguous map (one frame of every position), or Wan's map after a spatial upsampling,
``[N, C, T, H, W]`` stored frame-major (``view(b, t, c, h, w).permute(0, 2, 1, 3, 4)``),
whose norm eager writes in the same layout. The output takes ``x``'s strides, as eager's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.channel_normalize import channel_normalize_reference
from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options, silu_rounded
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan, launch_rows


@LeanKernel
@triton.jit
def _channel_normalize_kernel(
    x_ptr, norm_ptr, gamma_ptr, bias_ptr, out_ptr,  # out: x's strides
    eps, scale, bias_value,  # fp32
    n_rows, C, HW, s_blocks,  # rows: N * C; HW: positions a frame; s_blocks: BLOCK_S blocks a frame
    sN, sC, sT, nN, nT,  # strides of x (and out) and of the norm, in elements
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    frame = tl.program_id(1) // s_blocks
    s = (tl.program_id(1) % s_blocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & (s < HW)[None, :]
    sample = (rows // C).to(tl.int64)
    channel = rows % C
    dtype = out_ptr.dtype.element_ty
    at = (sample * sN + channel.to(tl.int64) * sC + frame.to(tl.int64) * sT)[:, None] + s[None, :]
    grid_dependency_wait()
    x = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    norm = tl.load(norm_ptr + (sample * nN + frame.to(tl.int64) * nT)[:, None] + s[None, :], mask=ok, other=1.0)
    den = tl.where(norm != norm, norm, tl.where(norm > eps, norm, eps))
    y = tl.math.div_rn(x, den).to(dtype)
    y = (y.to(tl.float32) * scale).to(dtype)
    gamma = tl.load(gamma_ptr + channel, mask=row_ok, other=1.0).to(tl.float32)
    y = (y.to(tl.float32) * gamma[:, None]).to(dtype)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + channel, mask=row_ok, other=0.0).to(tl.float32)
        y = (y.to(tl.float32) + bias[:, None]).to(dtype)
    else:
        y = (y.to(tl.float32) + bias_value).to(dtype)
    if SILU:
        y = silu_rounded(y.to(tl.float32), dtype, INTERPRET)
    tl.store(out_ptr + at, y, mask=ok)


def _frames(t: torch.Tensor):
    """``(T, HW, s0, s1, sT)``: ``t`` ``[N, C, *spatial]`` (up to 5-D) read as ``[N, C, T, HW]``
    (T: the frames, HW: each frame's last two dims, or a 3-D tensor's one), each frame's HW
    elements contiguous; None where it cannot be."""
    if not 3 <= t.dim() <= 5:
        return None
    inner = t.shape[2:] if t.dim() == 3 else t.shape[-2:]
    hw = 1
    for size, stride in zip(reversed(inner), reversed(t.stride()[-len(inner):])):
        if size != 1 and stride != hw:
            return None
        hw *= size
    frames = t.shape[2] if t.dim() == 5 else 1
    return frames, hw, t.stride(0), t.stride(1), t.stride(2) if t.dim() == 5 else 0


def _eager_strides(x, norm, *args):
    """The strides of eager's output (x's, but for the dims of size 1, which TensorIterator lays out
    its own way): the chain run on meta tensors."""
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in (x, norm, *args)]
    return channel_normalize_reference(*meta).stride()


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: an output allocated with ``t``'s strides holds exactly its elements."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _per_channel(t, x) -> bool:
    """``t`` (gamma or bias) holds one value a channel of ``x`` (dim 1) once broadcast, in x's
    dtype: shape ``(C, 1, ...)`` of up to ``x.dim() - 1`` dims."""
    c = x.shape[1]
    return (t.dtype == x.dtype and t.device == x.device and t.numel() == c and 1 <= t.dim() <= x.dim() - 1
            and t.shape[0] == c and t.is_contiguous())


def supported_layout(x, norm, eps, scale, gamma, bias=None, bias_value=0.0, silu=False, scale_tensor=None) -> bool:
    """can_use without the device check: a float ``x`` of ``[N, C, *spatial]`` (up to 5-D),
    dense, each frame's positions contiguous (:func:`_frames`), its fp32 norm over the channels
    ``[N, 1, *spatial]`` with contiguous frames too, gamma (and a tensor bias) one value a
    channel in x's dtype; a scale tensor an fp32 number on the host."""
    if scale_tensor is not None and not (scale_tensor.dim() == 0 and scale_tensor.dtype == torch.float32
                                         and scale_tensor.device.type == "cpu"):
        return False
    if not (x.dtype in DTYPES and x.dim() >= 3 and x.numel() > 0 and x.numel() < 2**31 and _dense(x)):
        return False
    frames, norm_frames = _frames(x), _frames(norm)
    if frames is None or norm_frames is None or frames[:2] != norm_frames[:2]:
        return False
    if not (norm.dtype == torch.float32 and norm.device == x.device and norm.shape == (x.shape[0], 1, *x.shape[2:])):
        return False
    return _per_channel(gamma, x) and (bias is None or _per_channel(bias, x))


def can_use(x, norm, eps, scale, gamma, bias=None, bias_value=0.0, silu=False, scale_tensor=None) -> bool:
    return x.is_cuda and supported_layout(x, norm, eps, scale, gamma, bias, bias_value, silu, scale_tensor)


@cached_plan
def _plan(x, norm):
    rows = x.shape[0] * x.shape[1]
    frames, hw, sN, sC, sT = _frames(x)
    _, _, nN, _, nT = _frames(norm)
    (row_blocks, s_blocks), block_r, block_s = launch_rows(rows, hw)
    grid = (row_blocks, frames * s_blocks)
    return grid, (rows, x.shape[1], hw, s_blocks, sN, sC, sT, nN, nT), dict(BLOCK_R=block_r, BLOCK_S=block_s)


def bind(x, norm, eps, scale, gamma, bias=None, bias_value=0.0, silu=False, scale_tensor=None):
    """:func:`channel_normalize` for inputs of this signature, its host arithmetic done (but a
    scale tensor's value, which a graph's next call may change)."""
    grid, ints, blocks = _plan(x, norm)
    kernel = _channel_normalize_kernel.bind(grid, **blocks, HAS_BIAS=bias is not None, SILU=bool(silu),
                                            INTERPRET=INTERPRET, num_warps=4, enable_fp_fusion=False,
                                            **libdevice_options())
    eps, scale, bias_value = float(eps), float(scale), float(bias_value)
    shape, stride, dtype = x.shape, _eager_strides(x, norm, eps, scale, gamma, bias, bias_value, silu), x.dtype

    def launch(x, norm, _eps, _scale, gamma, bias=None, _bias_value=0.0, _silu=False, scale_tensor=None):
        out = torch.empty_strided(shape, stride, dtype=dtype, device=x.device)
        kernel(x, norm, gamma, gamma if bias is None else bias, out, eps,
               scale if scale_tensor is None else scale_tensor.item(), bias_value, *ints)
        return out

    return launch


def channel_normalize(x, norm, eps, scale, gamma, bias=None, bias_value=0.0, silu=False, scale_tensor=None):
    """Launch; the caller has checked :func:`can_use`."""
    args = (x, norm, eps, scale, gamma, bias, bias_value, silu, scale_tensor)
    return bind(*args)(*args)


CHANNEL_NORMALIZE = Impl(run=channel_normalize, supports=supported_layout, bind=bind)
