"""Triton GEMMs at cuBLAS's bits, with the chain that follows a linear layer as their epilogue.

Why the bits are cuBLAS's: a non-split-K Hopper GEMM (cuBLAS's nvjet kernels, with their bias
epilogue) keeps one fp32 accumulator per output element, fed by ``wgmma`` k16 steps in
increasing K, adds the bias in fp32 and rounds once. This kernel does the same (``acc =
tl.dot(a, w.T, acc)`` over K in order, the bias added to the fp32 sum), whatever its tile
sizes, stages or warp specialization; measured on 15 DiT shapes (``../shared/probes`` and
``bench/gemm.py``). Where cuBLAS picks a split-K kernel (small M, large K) the sums are
ordered otherwise: first-sight verification (:mod:`sgdiff.kernels.dispatch`) finds that and
the signature stays on cuBLAS.

The epilogue, in registers on the rounded linear output ``y`` (each step as eager rounds it):

    y = round(acc + bias)                      # the linear (addmm / mm), x.dtype
    y = silu(gate) * hidden                    # GLU: the two halves of the weight's rows, each its own
                                               # accumulator (a SwiGLU), SiLU and product as ATen's, rounded
    y = act(y)                                 # ACT: ATen's GELU-tanh / GELU / SiLU in fp32, rounded
    y = residual + g(gate) * y                 # RESIDUAL: sgdiff::residual_gate's steps and dtypes

A second A operand (``x2``) continues K after the first (``linear(cat([x, x2], -1), w)``
without the cat in memory): the weight's columns from ``K1`` on pair with ``x2``'s, in the
same increasing order, so the sums are the cat's.

Persistent: ``min(ctas x SMs, tiles)`` programs walk the output tiles in GROUP_M-swizzled
order; A, the weight, the output and the residual through TMA descriptors built on the device
(Triton's allocator gives their scratch; :func:`sgdiff.kernels.triton.triton_compat.ensure_allocator`).
With two programs an SM (``Config.ctas``, where their shared memory fits: :func:`configs`) one
program's epilogue runs while the other's tensor-core loop does; ``Config.subtile`` takes the
epilogue in two column halves (half its registers and staging). Which configuration runs is
chosen per signature by timing (the ops' ``variants``; ``bench/results/gemm-sweep.md`` chose
the candidates).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import first_variant_impl
from sgdiff.kernels.triton.cuda_math import INTERPRET, dot_acc, expf, gelu_erf, libdevice_options, silu_rounded, tanhf
from sgdiff.kernels.triton.gelu_tanh_cat import gelu_tanh
from sgdiff.kernels.triton.launch import LeanKernel, grid_dependency_wait
from sgdiff.kernels.triton.rows import TL_DTYPE
from sgdiff.kernels.triton.triton_compat import ensure_allocator

HALF = (torch.float16, torch.bfloat16)
ACTS = {"none": 0, "gelu_tanh": 1, "gelu": 2, "silu": 3}
GLUS = {"none": 0, "gate_second": 1, "gate_first": 2}
GATE_FNS = {"plain": 0, "tanh": 1, "sigmoid": 2}


@triton.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Output tile ``tile_id`` in GROUP_M-row groups (consecutive programs share A's rows in L2)."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    rows = min(num_pid_m - first_m, GROUP_M)
    return first_m + (tile_id % in_group) % rows, (tile_id % in_group) // rows


@triton.jit
def _epilogue(acc, acc2, om, on, M, N, S,
              bias_ptr, res_desc, gate_ptr, out_desc,
              stride_gb, stride_gs, stride_gn,
              HAS_BIAS: tl.constexpr, GLU: tl.constexpr, ACT: tl.constexpr, RESIDUAL: tl.constexpr,
              GATE_FN: tl.constexpr, GATE_ROWS: tl.constexpr, LINEAR_DTYPE: tl.constexpr,
              PRODUCT_DTYPE: tl.constexpr, SUM_DTYPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              INTERPRET: tl.constexpr):
    """The chain after the GEMM on the fp32 tile ``acc`` (rows ``om..``, columns ``on..``; with
    GLU, ``acc2`` the same columns of the weight's second half), each step rounded as eager
    rounds it, stored through ``out_desc``."""
    rn = on + tl.arange(0, BN)
    if HAS_BIAS:  # the bias joins the fp32 sum before the one rounding, as cuBLAS's epilogue
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if GLU != 0:
            acc2 = acc2 + tl.load(bias_ptr + N + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    y = acc.to(LINEAR_DTYPE)
    if GLU != 0:  # 1: silu(second half) * first (diffusers' SwiGLU); 2: silu(first half) * second
        y2 = acc2.to(LINEAR_DTYPE)
        if GLU == 1:
            gate, hidden = y2, y
        else:
            gate, hidden = y, y2
        y = (silu_rounded(gate.to(tl.float32), LINEAR_DTYPE, INTERPRET).to(tl.float32)
             * hidden.to(tl.float32)).to(LINEAR_DTYPE)
    if ACT == 1:
        y = gelu_tanh(y.to(tl.float32), INTERPRET).to(LINEAR_DTYPE)
    elif ACT == 2:
        y = gelu_erf(y.to(tl.float32), INTERPRET).to(LINEAR_DTYPE)
    elif ACT == 3:
        y = silu_rounded(y.to(tl.float32), LINEAR_DTYPE, INTERPRET)
    if RESIDUAL:  # sgdiff::residual_gate on the tile (kernels/triton/residual_gate.py)
        if GATE_ROWS:  # a gate per row (per token), or a tile across batch entries
            rm = (om + tl.arange(0, BM)).to(tl.int64)
            mask = (rm < M)[:, None] & (rn < N)[None, :]
            g = tl.load(gate_ptr + ((rm // S) * stride_gb + (rm % S) * stride_gs)[:, None] + rn[None, :] * stride_gn,
                        mask=mask, other=0.0)
        else:  # one gate row for the whole tile: its function runs once a column
            g = tl.load(gate_ptr + (om // S) * stride_gb + rn * stride_gn, mask=rn < N, other=0.0)
        if GATE_FN == 1:
            g = tanhf(g.to(tl.float32), INTERPRET).to(gate_ptr.dtype.element_ty)
        elif GATE_FN == 2:
            e = expf(g.to(tl.float32) * -1.0, INTERPRET)
            g = tl.math.div_rn(tl.full(e.shape, 1.0, tl.float32), 1.0 + e).to(gate_ptr.dtype.element_ty)
        if GATE_ROWS:
            product = (g.to(tl.float32) * y.to(tl.float32)).to(PRODUCT_DTYPE)
        else:
            product = (g.to(tl.float32)[None, :] * y.to(tl.float32)).to(PRODUCT_DTYPE)
        r = res_desc.load([om, on])
        out_desc.store([om, on], (r.to(tl.float32) + product.to(tl.float32)).to(SUM_DTYPE)
                       .to(out_desc.dtype))
    else:
        out_desc.store([om, on], y)


@LeanKernel
@triton.jit
def _gemm_kernel(
    a_ptr, a2_ptr,  # A [M, K1] and (HAS_A2) A2 [M, K2], rows strided, unit column stride
    w_ptr,  # the weight [N, K1 + K2] (nn.Linear's layout), rows strided
    bias_ptr,  # [N] (unused unless HAS_BIAS)
    res_ptr,  # [M, N] contiguous residual, 16-byte aligned (unused unless RESIDUAL)
    gate_ptr,  # gate broadcast to [B, S, N] through (stride_gb, stride_gs, stride_gn)
    out_ptr,  # [M, N] contiguous output
    M, N, K1, K2, S,  # S: rows per batch entry (the gate's row index is (row // S, row % S))
    stride_am, stride_a2m, stride_wn,
    stride_gb, stride_gs, stride_gn,
    HAS_A2: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    GLU: tl.constexpr,  # 0; else the weight holds 2N rows, its halves' products joined (see _epilogue)
    RESIDUAL: tl.constexpr, GATE_FN: tl.constexpr,
    GATE_ROWS: tl.constexpr,  # the gate varies along a tile's rows (else one row serves the tile)
    LINEAR_DTYPE: tl.constexpr,  # the linear's output dtype (x's)
    PRODUCT_DTYPE: tl.constexpr, SUM_DTYPE: tl.constexpr,  # promote(gate, y), promote(residual, product)
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, WS: tl.constexpr, FLATTEN: tl.constexpr,
    SUBTILE: tl.constexpr,  # the epilogue in two halves of BN // 2 columns (half the registers and staging)
    INTERPRET: tl.constexpr,
):
    grid_dependency_wait()
    EN: tl.constexpr = BN // 2 if SUBTILE else BN  # the epilogue's tile width
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K1], strides=[stride_am, 1], block_shape=[BM, BK])
    if HAS_A2:
        a2_desc = tl.make_tensor_descriptor(a2_ptr, shape=[M, K2], strides=[stride_a2m, 1], block_shape=[BM, BK])
    else:
        a2_desc = a_desc
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N * 2 if GLU != 0 else N, K1 + K2], strides=[stride_wn, 1],
                                       block_shape=[BN, BK])
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EN])
    if RESIDUAL:
        res_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EN])
    else:
        res_desc = out_desc
    k1_tiles = tl.cdiv(K1, BK)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN,
                            warp_specialize=WS):
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        om = pid_m * BM
        on = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)  # GLU's second half (else unused, and dropped)
        for ki in range(k1_tiles):  # K in increasing order: one accumulator, as cuBLAS's
            a = a_desc.load([om, ki * BK])
            acc = dot_acc(a, w_desc.load([on, ki * BK]).T, acc)
            if GLU != 0:  # the same columns of the second half: its own accumulator, in the same order
                acc2 = dot_acc(a, w_desc.load([N + on, ki * BK]).T, acc2)
        if HAS_A2:  # the cat's second part: K1 is a multiple of BK, so the weight's columns line up
            for ki in range(tl.cdiv(K2, BK)):
                acc = dot_acc(a2_desc.load([om, ki * BK]), w_desc.load([on, K1 + ki * BK]).T, acc)
        if SUBTILE:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, EN)), (0, 2, 1)))
            left2, right2 = tl.split(tl.permute(tl.reshape(acc2, (BM, 2, EN)), (0, 2, 1)))
            _epilogue(left, left2, om, on, M, N, S, bias_ptr, res_desc, gate_ptr, out_desc, stride_gb, stride_gs,
                      stride_gn, HAS_BIAS, GLU, ACT, RESIDUAL, GATE_FN, GATE_ROWS, LINEAR_DTYPE, PRODUCT_DTYPE,
                      SUM_DTYPE, BM, EN, INTERPRET)
            _epilogue(right, right2, om, on + EN, M, N, S, bias_ptr, res_desc, gate_ptr, out_desc, stride_gb,
                      stride_gs, stride_gn, HAS_BIAS, GLU, ACT, RESIDUAL, GATE_FN, GATE_ROWS, LINEAR_DTYPE,
                      PRODUCT_DTYPE, SUM_DTYPE, BM, EN, INTERPRET)
        else:
            _epilogue(acc, acc2, om, on, M, N, S, bias_ptr, res_desc, gate_ptr, out_desc, stride_gb, stride_gs,
                      stride_gn, HAS_BIAS, GLU, ACT, RESIDUAL, GATE_FN, GATE_ROWS, LINEAR_DTYPE, PRODUCT_DTYPE,
                      SUM_DTYPE, BM, EN, INTERPRET)


class Config(NamedTuple):
    """One tile configuration: output tile BM x BN, K step BK, pipeline stages, warps, whether
    the persistent loop is warp-specialized (a producer warp group feeding TMA loads), how many
    programs share an SM (``ctas``: with two, one program's epilogue runs while the other's
    tensor-core loop does), and whether the epilogue takes the tile in two halves."""
    BM: int
    BN: int
    BK: int
    stages: int
    warps: int
    ws: bool = False
    ctas: int = 1
    subtile: bool = False

    @property
    def label(self) -> str:
        return (f"{self.BM}x{self.BN}x{self.BK} s{self.stages} w{self.warps}{' ws' if self.ws else ''}"
                f"{f' c{self.ctas}' if self.ctas > 1 else ''}{' sub' if self.subtile else ''}")


#: what first sight times for M >= 256 and for fewer rows: the fastest of bench/results/gemm-sweep.md
#: on DiT shapes (each the best, or within 2% of it, of one or more cases, plain or fused)
LARGE_M = (Config(128, 256, 64, 3, 8, subtile=True), Config(128, 256, 64, 4, 8, subtile=True),
           Config(256, 128, 64, 3, 8, subtile=True), Config(128, 128, 64, 3, 4, ctas=2, subtile=True),
           Config(128, 128, 64, 3, 8, ctas=2, subtile=True), Config(128, 128, 64, 4, 4, ws=True))
SMALL_M = (Config(64, 128, 64, 4, 4, ctas=2, subtile=True), Config(64, 128, 64, 4, 4),
           Config(128, 128, 64, 4, 4, ws=True), Config(64, 256, 64, 3, 4))
#: every configuration the GEMM bench's sweep times (``bench/gemm.py --sweep``)
SWEEP = tuple(dict.fromkeys(LARGE_M + SMALL_M + (
    Config(128, 256, 64, 3, 8), Config(128, 256, 64, 3, 8, ws=True), Config(128, 128, 64, 2, 4, ctas=2),
    Config(128, 128, 64, 2, 4, ctas=2, subtile=True), Config(64, 256, 64, 2, 4, ctas=2, subtile=True),
    Config(128, 128, 32, 4, 4, ctas=2, subtile=True), Config(128, 64, 64, 4, 4, ctas=2),
    Config(128, 128, 64, 2, 8, ctas=2), Config(128, 128, 64, 2, 8, ctas=2, subtile=True))))
#: what first sight times for a GLU (two accumulators a tile: the registers of one twice as wide)
GLU_CONFIGS = (Config(128, 128, 64, 3, 8, subtile=True), Config(128, 128, 64, 4, 8),
               Config(128, 64, 64, 4, 4, ctas=2), Config(64, 128, 64, 4, 4))
SMEM = 233472  # bytes of shared memory an SM holds for its programs on sm_90 (228 KiB)
SMEM_RESERVED = 1024 + 640  # what the runtime keeps a program, and what _smem may leave out


def _smem(c: Config, out_size: int, residual_size: int, weight_tiles: int = 1) -> int:
    """Shared memory a program takes: the pipeline's A and weight tiles (two a stage for a GLU),
    the epilogue's staging of its output tile and of the residual's (as Triton 3.6 compiles them
    for sm_90, within 0.6 KiB of this, over every configuration and epilogue)."""
    width = c.BN // 2 if c.subtile else c.BN
    return c.stages * (c.BM + weight_tiles * c.BN) * c.BK * 2 + c.BM * width * (out_size + residual_size)


def configs(M: int, K1: int, out_size: int, has_a2: bool, residual_size: int = 0,
            candidates: Optional[Tuple[Config, ...]] = None, glu: bool = False) -> Tuple[Config, ...]:
    """The configurations worth timing for this problem: of ``candidates`` (by default those
    for its row count, or a GLU's), the ones whose programs fit in shared memory ``ctas`` to an SM."""
    default = GLU_CONFIGS if glu else (LARGE_M if M >= 256 else SMALL_M)
    found = tuple(c for c in (candidates or default)
                  if c.ctas * (_smem(c, out_size, residual_size, 2 if glu else 1) + SMEM_RESERVED) <= SMEM
                  and (not has_a2 or (K1 % c.BK == 0 and not c.ws)))
    return found or (Config(64, 64, 64, 2, 4),)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _aligned(t: torch.Tensor) -> bool:
    """What a TMA descriptor takes: unit last stride, 16-byte aligned base and row stride."""
    return (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0 and t.shape[1] * t.element_size() >= 16)


def supported(x, weight, bias, x2=None) -> bool:
    """Whether the kernel computes ``linear(x[, x2], weight, bias)``: one half dtype, 2-D operand
    views TMA takes, and K1 a multiple of 64 with a second operand."""
    if x.dtype not in HALF or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 1 or x.numel() == 0:
        return False
    k1 = x.shape[-1]
    k2 = x2.shape[-1] if x2 is not None else 0
    if weight.shape[1] != k1 + k2 or weight.shape[0] % 8 or weight.shape[0] == 0 or not _aligned(weight):
        return False
    if bias is not None and (bias.dim() != 1 or bias.dtype != x.dtype or bias.shape[0] != weight.shape[0]
                             or bias.stride(0) != 1):
        return False
    a = _rows(x)
    if a is None or not _aligned(a) or a.shape[0] * weight.shape[0] >= 2 ** 31:
        return False
    if x2 is not None:
        a2 = _rows(x2)
        if (a2 is None or x2.dtype != x.dtype or tuple(x2.shape[:-1]) != tuple(x.shape[:-1]) or not _aligned(a2)
                or k1 % 64):
            return False
    return True


def _rows(x: torch.Tensor) -> Optional[torch.Tensor]:
    """``x`` as a 2-D ``[M, K]`` view (None where its rows cannot be viewed so)."""
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return None


class Epilogue(NamedTuple):
    glu: str = "none"  # "gate_second" (silu(second half) * first), "gate_first", or none
    act: str = "none"
    gate_kind: str = "plain"
    residual: bool = False
    product_dtype: torch.dtype = torch.bfloat16
    sum_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.bfloat16


def launcher(config: Config, x, weight, bias, x2=None, epilogue: Epilogue = Epilogue(), gate=None):
    """``launch(x, weight, bias, x2, residual, gate) -> out`` for operands of this signature
    (``gate`` broadcast to the output's ``[B, S, N]``, or ``[S, N]``)."""
    ensure_allocator()
    a = _rows(x)
    M, K1 = a.shape
    N = weight.shape[0] // 2 if epilogue.glu != "none" else weight.shape[0]  # the output's columns
    K2 = x2.shape[-1] if x2 is not None else 0
    lead = tuple(x.shape[:-1])
    tiles = triton.cdiv(M, config.BM) * triton.cdiv(N, config.BN)
    programs = min(tiles, config.ctas * (_sm_count(x.get_device()) if x.is_cuda else 2))
    S, gate_strides = _gate_geometry(gate, lead, N)
    # one gate row serves a tile where the gate is constant along a batch entry's rows and no
    # tile spans two entries
    gate_rows = gate is not None and not (gate_strides[1] == 0 and (S == M or S % config.BM == 0))
    out_dtype = epilogue.out_dtype if epilogue.residual else x.dtype
    kernel = _gemm_kernel.bind(
        (programs,), HAS_A2=x2 is not None, HAS_BIAS=bias is not None, ACT=ACTS[epilogue.act], GLU=GLUS[epilogue.glu],
        RESIDUAL=epilogue.residual, GATE_FN=GATE_FNS[epilogue.gate_kind], GATE_ROWS=gate_rows,
        LINEAR_DTYPE=TL_DTYPE[x.dtype],
        PRODUCT_DTYPE=TL_DTYPE[epilogue.product_dtype], SUM_DTYPE=TL_DTYPE[epilogue.sum_dtype],
        BM=config.BM, BN=config.BN, BK=config.BK, GROUP_M=8, NUM_PROGRAMS=programs, WS=config.ws,
        FLATTEN=x2 is None, SUBTILE=config.subtile, INTERPRET=INTERPRET, num_stages=config.stages, num_warps=config.warps,
        enable_fp_fusion=False, **libdevice_options())
    a_stride = a.stride(0)
    a2_stride = _rows(x2).stride(0) if x2 is not None else 0
    ints = (M, N, K1, K2, S, a_stride, a2_stride, weight.stride(0), *gate_strides)

    def launch(x, weight, bias, x2=None, residual=None, gate=None):
        out = torch.empty((*lead, N), dtype=out_dtype, device=x.device)
        kernel(x, x2 if x2 is not None else x, weight, bias if bias is not None else weight,
               residual if residual is not None else out, gate if gate is not None else out, out, *ints)
        return out

    return launch


def _gate_geometry(gate, lead, N):
    """``(S, strides)``: the output's rows per batch entry, and the gate's strides over
    ``[B, S, N]`` (a 2-D output is one batch entry)."""
    if gate is None:
        return 1, (0, 0, 0)
    shape = (1, *lead, N) if len(lead) == 1 else (*lead, N)
    return shape[1], tuple(gate.expand(shape).stride())


#: the configurations :func:`_timed` offers (None: :func:`configs`' choice for the problem);
#: the GEMM bench's sweep sets SWEEP here
candidates: list = [None]


def _timed(make, x, weight, bias, x2=None, out_size: int = 2, residual_size: int = 0, glu: bool = False):
    """Every configuration's launch for this problem, labelled (first sight times them)."""
    a = _rows(x)
    return [(c.label, make(c)) for c in configs(a.shape[0], a.shape[1], out_size, x2 is not None, residual_size,
                                                candidates[-1], glu)]


# --- the ops' implementations (sgdiff/kernels/linear*.py declare the ops) -----------------

def linear_supported(x, weight, bias=None, x2=None) -> bool:
    return supported(x, weight, bias, x2)


def linear_variants(x, weight, bias=None, x2=None):
    def make(c):
        launch = launcher(c, x, weight, bias, x2)
        return lambda x, weight, bias=None, x2=None: launch(x, weight, bias, x2)
    return _timed(make, x, weight, bias, x2)


def linear_act_supported(x, weight, bias, act) -> bool:
    return act in ACTS and supported(x, weight, bias)


def linear_act_variants(x, weight, bias, act):
    def make(c):
        launch = launcher(c, x, weight, bias, None, Epilogue(act=act))
        return lambda x, weight, bias, act: launch(x, weight, bias)
    return _timed(make, x, weight, bias)


def linear_glu_supported(x, weight, bias, gate_first, wide_silu=False) -> bool:
    """A linear whose weight's rows are two halves of whole 16-byte rows of output (N % 8)."""
    return weight.dim() == 2 and weight.shape[0] % 16 == 0 and supported(x, weight, bias)


def linear_glu_variants(x, weight, bias, gate_first, wide_silu=False):
    """The fused GEMM's configurations, and cuBLAS followed by sgdiff's silu_mul kernel (what the
    activation family runs where the gemm family does not: first sight keeps the faster)."""
    from sgdiff.kernels.triton import silu_mul as tsilu

    epilogue = Epilogue(glu="gate_first" if gate_first else "gate_second")

    def make(c):
        launch = launcher(c, x, weight, bias, None, epilogue)
        return lambda x, weight, bias, gate_first, wide_silu=False: launch(x, weight, bias)

    def halves(x, weight, bias, gate_first):
        first, second = torch.nn.functional.linear(x, weight, bias).chunk(2, dim=-1)
        return (first, second) if gate_first else (second, first)

    def cublas_silu_mul(x, weight, bias, gate_first, wide_silu=False):
        return tsilu.silu_mul(*halves(x, weight, bias, gate_first), wide_silu)

    found = _timed(make, x, weight, bias, glu=True)
    projection = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device="meta")
    if tsilu.supported_layout(*projection.chunk(2, dim=-1), wide_silu):
        found.insert(0, ("cublas silu_mul", cublas_silu_mul))
    return found


def _residual_epilogue(x, residual, gate, gate_kind, out_dtype) -> Epilogue:
    product = torch.promote_types(gate.dtype, x.dtype)
    total = torch.promote_types(residual.dtype, product)
    return Epilogue(gate_kind=gate_kind, residual=True, product_dtype=product, sum_dtype=total,
                    out_dtype=out_dtype or total)


def linear_residual_gate_supported(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None) -> bool:
    if gate_kind not in GATE_FNS or not supported(x, weight, bias, x2):
        return False
    out_shape = (*x.shape[:-1], weight.shape[0])
    if tuple(residual.shape) != out_shape or not residual.is_contiguous() or len(out_shape) not in (2, 3):
        return False
    if not _aligned(residual.view(-1, out_shape[-1])):  # read through a TMA descriptor
        return False
    if any(t.dtype not in TL_DTYPE or t.device != x.device for t in (residual, gate)):
        return False
    if out_dtype is not None and out_dtype not in TL_DTYPE:
        return False
    try:
        return tuple(torch.broadcast_shapes(gate.shape, out_shape)) == out_shape and gate.dim() <= len(out_shape)
    except RuntimeError:
        return False


def linear_residual_gate_variants(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None):
    epilogue = _residual_epilogue(x, residual, gate, gate_kind, out_dtype)

    def make(c):
        launch = launcher(c, x, weight, bias, x2, epilogue, gate)

        def run(x, weight, bias, residual, gate, gate_kind, out_dtype=None, x2=None):
            return launch(x, weight, bias, x2, residual, gate)
        return run
    return _timed(make, x, weight, bias, x2, epilogue.out_dtype.itemsize, residual.element_size())


LINEAR = first_variant_impl(linear_variants, linear_supported)
LINEAR_ACT = first_variant_impl(linear_act_variants, linear_act_supported)
LINEAR_GLU = first_variant_impl(linear_glu_variants, linear_glu_supported)
LINEAR_RESIDUAL_GATE = first_variant_impl(linear_residual_gate_variants, linear_residual_gate_supported)
