"""sgdiff::linear and sgdiff::linear_act on quack's Hopper GEMM (CuTe DSL), at cuBLAS's bits.

quack's SM90 GEMM is persistent and warp-specialized: a producer warp group loads A and B tiles
by TMA, and in its pingpong form two consumer warp groups take alternate tiles, so that one runs
its epilogue while the other's tensor cores run the next tile. That overlap is what a fused
epilogue needs to cost nothing: sgdiff's Triton GEMM (:mod:`sgdiff.kernels.triton.gemm`) runs
its epilogue after its mainloop, and ATen's GELU-tanh on every element of Flux's or Wan's
feed-forward made it slower than cuBLAS and ATen's separate GELU (``bench/results/gemm.md``).

The bits: each output element is one fp32 accumulator over K in increasing order (quack splits
K only when asked; it is never asked here), the bias added in fp32 and one rounding to the
output dtype, as cuBLAS's non-split-K kernels compute ``F.linear``; the activation is ATen's,
applied to the rounded projection and rounded again (:mod:`sgdiff.kernels.cute.exact`). Like
every tuned op's implementation, each configuration is verified against eager at first sight
of a signature and kept only if it is the fastest there; a signature cuBLAS splits over K (a
projection of one or two rows) differs, so cuBLAS keeps it.

Taken for contiguous bf16/fp16 operands on a compute capability 9.x GPU (quack mints another
kernel class on Blackwell, whose epilogue sees packed pairs), K and N multiples of 8 (16-byte
rows for TMA), a bias or none, GELU-tanh as the activation.
"""
from __future__ import annotations

import functools

import torch
from quack.epilogue.frontend import gemm_epilogue
from quack.epilogue.ops import RowVecLoad

from sgdiff.kernels.cute.exact import add_rn, gelu_tanh_aten, round_bf16, round_f16
from sgdiff.kernels.registry import first_variant_impl

#: tile configurations first sight times (quack's SM90 space: pingpong 128 x 128..208,
#: cooperative 256 x 128..208 and 128 x 256; clusters of two CTAs along M or N)
CONFIGS = {
    "pingpong 128x192 cluster 2x1": dict(tile_M=128, tile_N=192, pingpong=True, cluster_M=2, cluster_N=1),
    "pingpong 128x128 cluster 2x1": dict(tile_M=128, tile_N=128, pingpong=True, cluster_M=2, cluster_N=1),
    "cooperative 128x256 cluster 2x1": dict(tile_M=128, tile_N=256, pingpong=False, cluster_M=2, cluster_N=1),
    "cooperative 256x128 cluster 2x1": dict(tile_M=256, tile_N=128, pingpong=False, cluster_M=2, cluster_N=1),
    "cooperative 256x192 cluster 1x2": dict(tile_M=256, tile_N=192, pingpong=False, cluster_M=1, cluster_N=2),
}

BIAS = {"bias": RowVecLoad("bias")}  # a row vector, also where M == N makes the shape ambiguous


@gemm_epilogue()
def linear_plain(acc):
    return {"D": acc}


@gemm_epilogue(ops=BIAS)
def linear_bias(acc, bias):
    return {"D": add_rn(acc, bias)}


@gemm_epilogue()
def gelu_tanh_bf16(acc):
    return {"D": gelu_tanh_aten(round_bf16(acc))}


@gemm_epilogue(ops=BIAS)
def gelu_tanh_bias_bf16(acc, bias):
    return {"D": gelu_tanh_aten(round_bf16(add_rn(acc, bias)))}


@gemm_epilogue()
def gelu_tanh_f16(acc):
    return {"D": gelu_tanh_aten(round_f16(acc))}


@gemm_epilogue(ops=BIAS)
def gelu_tanh_bias_f16(acc, bias):
    return {"D": gelu_tanh_aten(round_f16(add_rn(acc, bias)))}


#: (activation, has a bias, dtype) -> the epilogue
EPILOGUES = {
    (None, False, torch.bfloat16): linear_plain, (None, True, torch.bfloat16): linear_bias,
    (None, False, torch.float16): linear_plain, (None, True, torch.float16): linear_bias,
    ("gelu_tanh", False, torch.bfloat16): gelu_tanh_bf16, ("gelu_tanh", True, torch.bfloat16): gelu_tanh_bias_bf16,
    ("gelu_tanh", False, torch.float16): gelu_tanh_f16, ("gelu_tanh", True, torch.float16): gelu_tanh_bias_f16,
}


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def supported(x, weight, bias, act=None) -> bool:
    """Whether these operands are ones the kernel takes (the module doc)."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and _hopper(x.device.index or 0)):
        return False
    if (act, bias is not None, x.dtype) not in EPILOGUES or weight.dtype != x.dtype or weight.dim() != 2:
        return False
    n, k = weight.shape
    if x.dim() < 2 or x.shape[-1] != k or k % 8 or n % 8 or x.numel() == 0 or n == 0:
        return False
    tensors = [x, weight] + ([] if bias is None else [bias])
    if bias is not None and (bias.dtype != x.dtype or tuple(bias.shape) != (n,)):
        return False
    return all(t.is_contiguous() and t.device == x.device and t.data_ptr() % 16 == 0 for t in tensors)


def launcher(config: dict, act, bias_given: bool, dtype):
    """``launch(x, weight, bias)`` of one configuration: a new ``[..., N]`` output."""
    epilogue = EPILOGUES[(act, bias_given, dtype)]

    def launch(x, weight, bias):
        n = weight.shape[0]
        out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
        operands = {} if bias is None else {"bias": bias[None]}
        epilogue.gemm(x.reshape(1, -1, x.shape[-1]), weight[None], out.view(1, -1, n), None, epi_args=operands, **config)
        return out

    return launch


def linear_supported(x, weight, bias=None, x2=None) -> bool:
    return x2 is None and supported(x, weight, bias)


def linear_variants(x, weight, bias=None, x2=None):
    def variant(config):
        launch = launcher(config, None, bias is not None, x.dtype)
        return lambda x, weight, bias=None, x2=None: launch(x, weight, bias)
    return [(label, variant(config)) for label, config in CONFIGS.items()]


def linear_act_supported(x, weight, bias, act) -> bool:
    return supported(x, weight, bias, act)


def linear_act_variants(x, weight, bias, act):
    def variant(config):
        launch = launcher(config, act, bias is not None, x.dtype)
        return lambda x, weight, bias, act: launch(x, weight, bias)
    return [(label, variant(config)) for label, config in CONFIGS.items()]


LINEAR = first_variant_impl(linear_variants, linear_supported)
LINEAR_ACT = first_variant_impl(linear_act_variants, linear_act_supported)
