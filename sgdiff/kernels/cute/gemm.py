"""sgdiff::linear, linear_act, linear_act_cat and linear_residual_gate on quack's Hopper GEMM (CuTe
DSL), at cuBLAS's bits.

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
rows for TMA), a bias or none, GELU-tanh as the activation; for ``linear_residual_gate``, a plain
gate in the dtypes eager promotes to (Wan's fp32 gate and sum, cast back), the residual read as a
tile beside the accumulator. The gate is one row for every token (``[1, 1, N]``: Flux's and Wan's
batch of one), a row per batch (``[B, 1, N]``: a batch of a prompt and its negative, each its own
GEMM of the batched launch, the weight shared by a zero-stride view), or one per token (a tile).
For ``linear_act_cat`` the store's destination is the cat's last columns (a row stride wider than
N, which TMA reads from the tensor's strides), the head copied beside them by gelu_tanh_cat's
Triton kernel over the head's columns alone.
"""
from __future__ import annotations

import functools

import torch
from quack.epilogue.frontend import gemm_epilogue
from quack.epilogue.ops import RowVecLoad

from sgdiff.kernels.cute.exact import add_rn, gelu_tanh_aten, mul_rn, round_bf16, round_f16
from sgdiff.kernels.registry import first_variant_impl
from sgdiff.kernels.triton import gelu_tanh_cat

def _config(tile_m: int, tile_n: int, pingpong: bool, cluster_m: int, cluster_n: int, swizzle: int = 0):
    """A configuration's label and quack's arguments; ``swizzle``, the tile scheduler's largest
    swizzle (quack's ``max_swizzle_size``; 0: quack's own, 8)."""
    label = f"{'pingpong' if pingpong else 'cooperative'} {tile_m}x{tile_n} cluster {cluster_m}x{cluster_n}"
    config = dict(tile_M=tile_m, tile_N=tile_n, pingpong=pingpong, cluster_M=cluster_m, cluster_N=cluster_n)
    if swizzle:
        label, config = f"{label} swizzle {swizzle}", dict(config, max_swizzle_size=swizzle)
    return label, config


#: tile configurations first sight times (quack's SM90 space: pingpong 128 x 128..208,
#: cooperative 256 x 128..208 and 128 x 256; clusters of two CTAs along M or N). Swizzle 1 (tiles
#: taken in raster order) at pingpong 128 x 128: where N is 3072 (Flux's q/k/v, output
#: projections) 0.97-1.02x of cuBLAS's time against 1.09-1.13x with quack's 8 (an H100,
#: bench/results/runs/h100-2026-12-06-h.md)
CONFIGS = dict(_config(*c) for c in [(128, 192, True, 2, 1), (128, 128, True, 2, 1), (128, 128, True, 2, 1, 1),
                                     (128, 256, False, 2, 1), (256, 128, False, 2, 1), (256, 192, False, 1, 2)])

#: the GEMM bench's sweep (``bench/gemm.py --sweep``): the SM90 space quack's own autotuner
#: searches (its ``gemm_config``), less its A/B swap, each pingpong tile also with swizzles 1 and 4
SWEEP = dict(_config(m, n, pingpong, *cluster, swizzle)
             for m, n, pingpong in ([(128, n, True) for n in (128, 160, 192, 208)] + [(192, 128, True)]
                                    + [(256, n, False) for n in (128, 160, 192, 208)]
                                    + [(128, 224, False), (128, 256, False)])
             for cluster in ((2, 1), (1, 2)) for swizzle in ((0, 1, 4) if pingpong else (0,)))

#: the configurations first sight times (None: CONFIGS); the GEMM bench's sweep sets SWEEP here
candidates: list = [None]


def configs() -> dict:
    return candidates[-1] or CONFIGS


BIAS = {"bias": RowVecLoad("bias")}  # a row vector, also where M == N makes the shape ambiguous


ROUNDINGS = {torch.bfloat16: round_bf16, torch.float16: round_f16}  # fp32 -> a 16-bit dtype -> fp32


SHORT = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
ACTS = (None, "gelu_tanh")


@functools.lru_cache(maxsize=None)
def linear_epilogue(act, has_bias: bool, dtype: torch.dtype):
    """``F.linear(x, weight, bias)`` as cuBLAS computes it (the bias added to the fp32 sum, one
    rounding by the store), and ATen's GELU-tanh of it rounded to x's dtype where ``act`` says."""
    update = ROUNDINGS[dtype]
    if act is None and has_bias:
        def fn(acc, bias):
            return {"D": add_rn(acc, bias)}
    elif act is None:
        def fn(acc):
            return {"D": acc}
    elif has_bias:
        def fn(acc, bias):
            return {"D": gelu_tanh_aten(update(add_rn(acc, bias)))}
    else:
        def fn(acc):
            return {"D": gelu_tanh_aten(update(acc))}
    fn.__name__ = fn.__qualname__ = f"{act or 'linear'}_{'bias_' if has_bias else ''}{SHORT[dtype]}"
    return gemm_epilogue(ops=BIAS if has_bias else {})(fn)


@functools.lru_cache(maxsize=None)
def residual_epilogue(has_bias: bool, dtype: torch.dtype, product_dtype: torch.dtype, per_token: bool = False):
    """``residual + gate * F.linear(x, weight, bias)`` as eager computes it: the projection rounded
    to x's dtype, the product in fp32 and rounded to ``product_dtype`` unless that is fp32, the sum
    in fp32 (rounded once, to the output's dtype, by the store). The gate is a row of each batch,
    or with ``per_token`` a tile (one value per output element)."""
    update = ROUNDINGS[dtype]
    product = ROUNDINGS.get(product_dtype)
    ops = {**({} if per_token else {"gate": RowVecLoad("gate")}), **(BIAS if has_bias else {})}
    if has_bias and product is None:
        def fn(acc, bias, residual, gate):
            return {"D": add_rn(residual, mul_rn(gate, update(add_rn(acc, bias))))}
    elif has_bias:
        def fn(acc, bias, residual, gate):
            return {"D": add_rn(residual, product(mul_rn(gate, update(add_rn(acc, bias)))))}
    elif product is None:
        def fn(acc, residual, gate):
            return {"D": add_rn(residual, mul_rn(gate, update(acc)))}
    else:
        def fn(acc, residual, gate):
            return {"D": add_rn(residual, product(mul_rn(gate, update(acc))))}
    fn.__name__ = fn.__qualname__ = (f"gated_residual_{'token_' if per_token else ''}{'bias_' if has_bias else ''}"
                                     f"{SHORT[dtype]}_{SHORT[product_dtype]}")
    return gemm_epilogue(ops=ops)(fn)


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def supported(x, weight, bias, act=None) -> bool:
    """Whether these operands are ones the kernel takes (the module doc)."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and _hopper(x.device.index or 0)):
        return False
    if act not in ACTS or x.dtype not in ROUNDINGS or weight.dtype != x.dtype or weight.dim() != 2:
        return False
    n, k = weight.shape
    if x.dim() < 2 or x.shape[-1] != k or k % 8 or n % 8 or x.numel() == 0 or n == 0:
        return False
    tensors = [x, weight] + ([] if bias is None else [bias])
    if bias is not None and (bias.dtype != x.dtype or tuple(bias.shape) != (n,)):
        return False
    return all(t.is_contiguous() and t.device == x.device and t.data_ptr() % 16 == 0 for t in tensors)


def launcher(config: dict, act, bias_given: bool, dtype):
    """``launch(x, weight, bias, out=None)`` of one configuration: the ``[..., N]`` output, new or
    ``out`` (the output's rows as a 2-D view: its row stride may be wider than N)."""
    epilogue = linear_epilogue(act, bias_given, dtype)

    def launch(x, weight, bias, out=None):
        n = weight.shape[0]
        y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device) if out is None else out
        operands = {} if bias is None else {"bias": bias[None]}
        d = y.view(1, -1, n) if out is None else out[None]
        epilogue.gemm(x.reshape(1, -1, x.shape[-1]), weight[None], d, None, epi_args=operands, **config)
        return y

    return launch


def linear_supported(x, weight, bias=None, x2=None) -> bool:
    return x2 is None and supported(x, weight, bias)


def linear_variants(x, weight, bias=None, x2=None):
    def variant(config):
        launch = launcher(config, None, bias is not None, x.dtype)
        return lambda x, weight, bias=None, x2=None: launch(x, weight, bias)
    return [(label, variant(config)) for label, config in configs().items()]


def linear_act_supported(x, weight, bias, act) -> bool:
    return supported(x, weight, bias, act)


def linear_act_variants(x, weight, bias, act):
    def variant(config):
        launch = launcher(config, act, bias is not None, x.dtype)
        return lambda x, weight, bias, act: launch(x, weight, bias)
    return [(label, variant(config)) for label, config in configs().items()]


def linear_act_cat_supported(head, x, weight, bias, act) -> bool:
    """The projection's operands as :func:`supported` says, and a ``head`` of x's dtype, device and
    leading dims whose width keeps the GEMM's columns of the cat 16-byte aligned."""
    if not supported(x, weight, bias, act) or not isinstance(head, torch.Tensor):
        return False
    return (head.dtype == x.dtype and head.device == x.device and head.dim() == x.dim()
            and tuple(head.shape[:-1]) == tuple(x.shape[:-1]) and head.shape[-1] % 8 == 0)


def _head_copy(head, x, width: int, n: int):
    """``copy(head, y)``: ``head`` into the first ``width`` columns of the contiguous cat ``y``
    (``[..., width + n]``), bound once for this signature: gelu_tanh_cat's Triton kernel over the
    head's blocks (vectorized), or ATen's copy (of a strided destination: not) where that does not
    take it."""
    tail = torch.empty((*x.shape[:-1], width + n), dtype=x.dtype, device="meta")[..., width:]
    geometry = torch.empty_strided(head.shape, head.stride(), dtype=head.dtype, device="meta")  # the plan's key
    if head.is_cuda and gelu_tanh_cat.supported_layout(geometry, tail):
        launch = gelu_tanh_cat.bind_head(geometry, tail)
        return lambda head, y: launch(head, y[..., width:], y)
    return lambda head, y: y[..., :width].copy_(head)


def linear_act_cat_variants(head, x, weight, bias, act):
    """``cat([head, act(F.linear(x, weight, bias))], -1)``: ``head`` copied into the first columns
    (read through its strides), the GEMM storing its activated tiles straight into the rest."""
    width, n = head.shape[-1], weight.shape[0]
    copy = _head_copy(head, x, width, n)

    def variant(config):
        launch = launcher(config, act, bias is not None, x.dtype)

        def run(head, x, weight, bias, act):
            y = torch.empty((*x.shape[:-1], width + n), dtype=x.dtype, device=x.device)
            copy(head, y)
            launch(x, weight, bias, out=y.view(-1, width + n)[:, width:])
            return y
        return run
    return [(label, variant(config)) for label, config in configs().items()]


def _residual_dtypes(x, residual, gate, out_dtype):
    """(product dtype, sum dtype, output dtype) as eager promotes them."""
    product = torch.promote_types(gate.dtype, x.dtype)
    total = torch.promote_types(residual.dtype, product)
    return product, total, out_dtype or total


def gate_layout(x, weight, gate):
    """How the gate spans the output ``[..., M, N]``: ``"row"`` (one row for every token),
    ``"batch"`` (a row per batch of a 3-D input: ``[B, 1, N]``), ``"token"`` (the output's
    shape), or None (a layout the kernel does not read)."""
    n = weight.shape[0]
    out_shape = (*x.shape[:-1], n)
    if gate.numel() == n and gate.shape[-1] == n and gate.dim() <= len(out_shape):
        return "row"
    if x.dim() == 3 and tuple(gate.shape) == (x.shape[0], 1, n):
        return "batch"
    if tuple(gate.shape) == out_shape:
        return "token"
    return None


def linear_residual_gate_supported(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None) -> bool:
    if gate_kind != "plain" or x2 is not None or not supported(x, weight, bias):
        return False
    n = weight.shape[0]
    if tuple(residual.shape) != (*x.shape[:-1], n) or not residual.is_contiguous() or residual.data_ptr() % 16:
        return False
    layout = gate_layout(x, weight, gate)
    if layout is None or gate.data_ptr() % 16:
        return False
    if layout == "batch":  # rows of a chunk of the modulation (Sana's [B, 6, N] in six): each row 16-byte aligned
        if gate.stride(-1) != 1 or gate.stride(0) * gate.element_size() % 16:
            return False
    elif not gate.is_contiguous():
        return False
    if gate.device != x.device or residual.device != x.device:
        return False
    product, total, out = _residual_dtypes(x, residual, gate, out_dtype)
    allowed = (torch.bfloat16, torch.float16, torch.float32)
    if any(t not in allowed for t in (residual.dtype, gate.dtype, out)) or product not in allowed:
        return False
    return out == total or total == torch.float32  # one rounding of the fp32 sum, as eager's cast


def _residual_operands(x, weight, bias, residual, gate, y):
    """The launch's (A, B, D, epilogue operands): the tokens as the rows of one GEMM, or with a
    gate row per batch one GEMM per batch (B, the weight, a zero-stride view of it)."""
    n, k = weight.shape
    layout = gate_layout(x, weight, gate)
    batches = x.shape[0] if layout == "batch" else 1
    if layout == "token":
        rows = gate.view(1, -1, n)  # a tile
    elif layout == "batch":
        rows = gate[:, 0]  # [B, N], its rows where the modulation holds them
    else:
        rows = gate.reshape(1, n)
    operands = {"residual": residual.view(batches, -1, n), "gate": rows}
    if bias is not None:
        operands["bias"] = bias if batches > 1 else bias[None]  # rank 1: one row shared by the batches
    return (x.reshape(batches, -1, k), weight[None].expand(batches, n, k), y.view(batches, -1, n), operands)


def linear_residual_gate_variants(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None):
    product, _, out = _residual_dtypes(x, residual, gate, out_dtype)
    epilogue = residual_epilogue(bias is not None, x.dtype, product, gate_layout(x, weight, gate) == "token")

    def variant(config):
        def run(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None):
            y = torch.empty(residual.shape, dtype=out, device=x.device)
            a, b, d, operands = _residual_operands(x, weight, bias, residual, gate, y)
            epilogue.gemm(a, b, d, None, epi_args=operands, **config)
            return y
        return run
    return [(label, variant(config)) for label, config in configs().items()]


LINEAR = first_variant_impl(linear_variants, linear_supported)
LINEAR_ACT = first_variant_impl(linear_act_variants, linear_act_supported)
LINEAR_ACT_CAT = first_variant_impl(linear_act_cat_variants, linear_act_cat_supported)
LINEAR_RESIDUAL_GATE = first_variant_impl(linear_residual_gate_variants, linear_residual_gate_supported)
