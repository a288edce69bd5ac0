"""Triton sgdiff::linear_attention_scores, bitwise equal to eager on CUDA.

One program computes a [BLOCK_M, BLOCK_D] tile of one head's [head_dim + 1, head_dim] scores
(a head's rows and columns split over programs, so that Sana's 140 heads fill the GPU several
times over rather than once and a tail): each score one fp32 accumulator taking the tokens'
products in increasing order, each a fused multiply-add (cuBLAS's order for these fp32 shapes:
no split-K); the last row's factor is the padding value itself. The tokens go ``BLOCK_N`` at a
time: a [BLOCK_M, BLOCK_N] tile of v and a [BLOCK_N, BLOCK_D] tile of k (a token's
head_dim channels adjacent in their projections, the transposed views Sana's processor makes),
ReLU'd (k, as ATen's) and widened in registers, then one fp32 ``tl.dot`` with IEEE precision onto
the accumulators. Triton lowers that dot to FMAs (no tensor core takes fp32 at IEEE precision),
each output's chain over the step's tokens in increasing order from the accumulator it is given:
the order above, with every load of a step issued at once. Tokens past the end load as zeros,
and ``fma(0, 0, acc)`` is ``acc``.

With Gluon, a second kernel lays the work out by hand (:func:`variants`: first sight times each
tiling against the kernel above and the former graph's ops). A thread holds an ``R x C`` tile of
the scores (``LR`` lanes along the rows, ``32 // LR`` along the columns, a program's warps one
under the other); ``BN`` tokens at a time, the program copies v's and k's tiles (a token's
channels contiguous, widened, k ReLU'd) into shared memory as fp32, the next tile's loads in
flight meanwhile. A thread then loads ``U`` tokens' operands at once (its rows of v and its
columns of k, as vector loads that the lanes sharing them read alike) and takes them out of its
registers token by token (:func:`in_thread.take`): ``R * C`` FMAs a token per thread, in token
order, no operand staging of a dot. Every thread also carries the padding row's chains for its
columns (``fma(value, k, acc)`` a token), stored once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgdiff.kernels.registry import Impl
from sgdiff.kernels.triton.cast_copy import relu_as_aten
from sgdiff.kernels.triton.launch import LeanKernel, fresh_output, grid_dependency_wait
from sgdiff.kernels.triton.rows import DTYPES, cached_plan
from sgdiff.kernels.triton.in_thread import bits, gluon, relu_as_aten as gl_relu_as_aten, take
from sgdiff.kernels.triton.triton_compat import gluon_barrier

if gluon is not None:
    from triton.experimental.gluon import language as gl

MAX_HEAD_DIM = 128  # the largest head_dim verified on a GPU (a program holds a tile of any)
MIN_DOT = 16  # tl.dot's smallest extent
# the fastest of 63 tilings at Sana's (2, 70, 32, 1024) on an H100: 27.9 µs, where one program a head (140
# programs of 4 warps, 64 rows for 33) took 42.5 and the reference 59.8; the fastest of Sana's 8 best at
# (2, 24, 64, 4096) and (1, 8, 128, 4096) too, 1.27x two warps' time at (1, 70, 32, 4096)
# (bench/results/runs/linear-attention-scores-sweep-h100-6d1f28b.json)
CONFIG = dict(BLOCK_M=16, BLOCK_D=32, BLOCK_N=64, num_warps=1)


@LeanKernel
@triton.jit
def _linear_attention_scores_kernel(
    v_ptr,  # [B, heads, D, N]
    k_ptr,  # [B, heads, N, D]
    out_ptr,  # [B * heads, D + 1, D] fp32, contiguous
    n_heads, N,
    sv0, sv1, sv2, sv3,
    sk0, sk1, sk2, sk3,
    value,  # the padding row's value (fp32)
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows a program (of v's D and the padding row)
    BLOCK_D: tl.constexpr,  # columns a program
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)  # (batch, head)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of the padded v, the last the padding's
    c = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    t = tl.arange(0, BLOCK_N)
    b, h = (pid // n_heads).to(tl.int64), (pid % n_heads).to(tl.int64)
    v_rows = v_ptr + b * sv0 + h * sv1 + m[:, None] * sv2
    k_cols = k_ptr + b * sk0 + h * sk1 + c[None, :] * sk3
    row_ok, pad_row, c_ok = (m < D)[:, None], (m == D)[:, None], (c < D)[None, :]
    grid_dependency_wait()
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, N, BLOCK_N):  # the tokens in increasing order
        n = n0 + t
        n_ok = n < N
        vt = tl.load(v_rows + n[None, :] * sv3, mask=row_ok & n_ok[None, :], other=0.0).to(tl.float32)
        vt = tl.where(pad_row & n_ok[None, :], value, vt)
        kt = relu_as_aten(tl.load(k_cols + n[:, None] * sk2, mask=n_ok[:, None] & c_ok, other=0.0).to(tl.float32))
        acc = tl.dot(vt, kt, acc, input_precision="ieee")
    out = out_ptr + pid.to(tl.int64) * (D + 1) * D
    tl.store(out + m[:, None] * D + c[None, :], acc, mask=(m <= D)[:, None] & c_ok)


if gluon is not None:
    @LeanKernel
    @gluon.jit
    def _linear_attention_scores_lanes_kernel(
        v_ptr, k_ptr, out_ptr,  # as _linear_attention_scores_kernel's
        n_heads, N,
        sv0, sv1, sv2, sv3,
        sk0, sk1, sk2, sk3,
        value,
        D: gl.constexpr,
        BLOCK_D: gl.constexpr,  # head_dim rounded up to a power of two, at least a warp's lanes
        R: gl.constexpr,  # rows a thread
        LR: gl.constexpr,  # lanes along the rows (the other 32 // LR along the columns)
        BN: gl.constexpr,  # tokens a tile
        U: gl.constexpr,  # tokens whose operands a thread loads at once
        VU: gl.constexpr,  # [U, ROWS]: U tokens' rows, a thread R of them (a row's lanes alike)
        KU: gl.constexpr,  # [U, BLOCK_D]: U tokens' columns, a thread its C (a column's lanes alike)
    ):
        W: gl.constexpr = gl.num_warps()
        ROWS: gl.constexpr = R * LR * W  # rows of v a program
        C: gl.constexpr = BLOCK_D * LR // 32  # columns a thread
        ACC: gl.constexpr = gl.BlockedLayout([R, C], [LR, 32 // LR], [W, 1], [0, 1])
        # tiles as they lie: a token's channels contiguous, 8 a thread
        LV: gl.constexpr = gl.BlockedLayout([1, 8], [256 // ROWS, ROWS // 8], [W, 1], [1, 0])  # [BN, ROWS]
        LK: gl.constexpr = gl.BlockedLayout([1, 8], [256 // BLOCK_D, BLOCK_D // 8], [W, 1], [1, 0])  # [BN, BLOCK_D]
        TILE: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # a token's row contiguous
        pid = gl.program_id(0)  # (batch, head)
        b, h = (pid // n_heads).to(gl.int64), (pid % n_heads).to(gl.int64)
        row0 = gl.program_id(1) * ROWS
        mv = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(0, LV))
        tv = gl.arange(0, BN, layout=gl.SliceLayout(1, LV))
        tk = gl.arange(0, BN, layout=gl.SliceLayout(1, LK))
        ck = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, LK))
        v_base = v_ptr + b * sv0 + h * sv1 + mv[None, :] * sv2
        k_base = k_ptr + b * sk0 + h * sk1 + ck[None, :] * sk3
        mv_ok, ck_ok = (mv < D)[None, :], (ck < D)[None, :]
        v_smem = gl.allocate_shared_memory(gl.float32, [BN, ROWS], TILE)
        k_smem = gl.allocate_shared_memory(gl.float32, [BN, BLOCK_D], TILE)
        COL: gl.constexpr = gl.SliceLayout(0, ACC)
        ROW: gl.constexpr = gl.SliceLayout(1, ACC)
        u = gl.arange(0, U, layout=gl.SliceLayout(1, VU))
        u2 = gl.arange(0, U, layout=gl.SliceLayout(1, KU))
        acc = gl.zeros([ROWS, BLOCK_D], gl.float32, ACC)
        pad = gl.zeros([BLOCK_D], gl.float32, COL)  # the padding row's chain
        pad_value = gl.full([BLOCK_D], value, gl.float32, COL)
        grid_dependency_wait()
        vt = gl.load(v_base + tv[:, None] * sv3, mask=mv_ok & (tv < N)[:, None], other=0.0)
        kt = gl.load(k_base + tk[:, None] * sk2, mask=(tk < N)[:, None] & ck_ok, other=0.0)
        for n0 in range(0, N, BN):  # the tokens in increasing order
            gluon_barrier()  # every thread is done with the previous tile
            v_smem.store(vt.to(gl.float32))
            k_smem.store(gl_relu_as_aten(kt.to(gl.float32)))
            nt = n0 + BN  # the next tile's loads in flight over this tile's products
            vt = gl.load(v_base + (nt + tv)[:, None] * sv3, mask=mv_ok & (nt + tv < N)[:, None], other=0.0)
            kt = gl.load(k_base + (nt + tk)[:, None] * sk2, mask=(nt + tk < N)[:, None] & ck_ok, other=0.0)
            gluon_barrier()
            for t0 in gl.static_range(0, BN, U):
                # U tokens' operands loaded at once (their latency once), then taken out of the
                # thread's registers token by token (a select and -0.0s that fold away)
                vu = v_smem.slice(t0, U, dim=0).load(VU)  # [U, ROWS]: a thread its rows, a warp's lanes alike
                ku = k_smem.slice(t0, U, dim=0).load(KU)  # [U, BLOCK_D]: a lane its columns
                for t in gl.static_range(U):
                    vv = gl.convert_layout(take(vu, u[:, None], t, 0), ROW)
                    kk = gl.convert_layout(take(ku, u2[:, None], t, 0), COL)
                    acc = gl.fma(gl.expand_dims(vv, 1), gl.expand_dims(kk, 0), acc)
                    pad = gl.fma(pad_value, kk, pad)
        m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ACC))
        c = gl.arange(0, BLOCK_D, layout=COL)
        out = out_ptr + pid.to(gl.int64) * (D + 1) * D
        gl.store(out + m[:, None] * D + c[None, :], acc, mask=(m < D)[:, None] & (c < D)[None, :])
        if gl.program_id(1) == 0:
            gl.store(out + D * D + c, pad, mask=c < D)


def supported_layout(v, k, value) -> bool:
    """can_use without the device check: v [B, heads, D, N] and k [B, heads, N, D] of one float
    dtype and device, D at most MAX_HEAD_DIM, a head's tokens within 32-bit offsets."""
    if not (v.dim() == 4 and k.dim() == 4 and v.dtype in DTYPES and k.dtype == v.dtype and v.numel() > 0
            and k.device == v.device):
        return False
    B, H, D, N = v.shape
    return (tuple(k.shape) == (B, H, N, D) and D <= MAX_HEAD_DIM and B * H < 2 ** 31
            and N * max(abs(v.stride(3)), abs(k.stride(2))) < 2 ** 31)  # a head's token offsets in 32 bits


def can_use(v, k, value) -> bool:
    return v.is_cuda and supported_layout(v, k, value)


def blocks(D: int, config: dict) -> dict:
    """The launch's tile sizes: ``config``'s, each at most head_dim's (head_dim + 1's for the rows)
    power of two and at least a dot's smallest extent."""
    return dict(config, BLOCK_M=max(MIN_DOT, min(config["BLOCK_M"], triton.next_power_of_2(D + 1))),
                BLOCK_D=max(MIN_DOT, min(config["BLOCK_D"], triton.next_power_of_2(D))))


@cached_plan
def _plan(v, k, config):
    B, H, D, N = v.shape
    out = (B * H, D + 1, D), ((D + 1) * D, D, 1)  # contiguous, as eager's bmm writes it
    consts = blocks(D, dict(config))
    grid = (B * H, triton.cdiv(D + 1, consts["BLOCK_M"]), triton.cdiv(D, consts["BLOCK_D"]))
    return grid, out, (H, N, *v.stride(), *k.stride()), dict(D=D, **consts)


def bind(v, k, value, config=None):
    """:func:`linear_attention_scores` for inputs of this signature, its host arithmetic done
    (``config``: tile sizes and warps other than :data:`CONFIG`'s, for a sweep)."""
    grid, (shape, strides), ints, consts = _plan(v, k, tuple(sorted((config or CONFIG).items())))
    kernel = _linear_attention_scores_kernel.bind(grid, **consts, enable_fp_fusion=False)
    return fresh_output(kernel, 2, shape, strides, torch.float32, *ints, float(value))


# (R, LR, warps, BN, U) of the lanes kernel that first sight tries, the first three of 13 (each with LR 1) timed
# on an H100: the fastest at (1, 70, 32, 1024) (16.1 us against 22.0 for the kernel above); the fastest at
# (2, 70, 32, 1024) and (2, 70, 32, 4096) (29.0 and 114.5 us against the kernel's 27.6 and 105.6: there first sight
# keeps the kernel); the second at (1, 70, 32, 1024) (17.7): bench/results/runs/linear-attention-probe-h100-e90a58a.json.
# With LR 1 every lane of a warp loads the same rows of v a token: a token's shared-memory reads are 9 values a lane
# for 8 FMAs, and an SM's reads, not its FMAs, bound it (16 us for one head an SM); R 4, LR 4 gives a thread a 4 x 4
# tile (8 values a lane for 16 FMAs), not yet timed.
LANES_TILINGS = ((8, 1, 4, 128, 8), (8, 1, 2, 256, 8), (8, 1, 4, 32, 8), (4, 4, 1, 64, 8), (4, 4, 2, 128, 8),
                 (4, 4, 1, 32, 8), (4, 4, 2, 64, 8))


def lanes_operand_layouts(R: int, LR: int, warps: int, block_d: int, U: int):
    """The lanes kernel's ``[U, rows]`` and ``[U, BLOCK_D]`` tiles of U tokens' operands: a thread
    holds U tokens of its R rows and of its C columns (``BLOCK_D * LR // 32``, adjacent), the
    rows', columns', lanes' and warps' bits as the accumulators' layout has them (lanes along the
    rows first: lane = row group + LR * column group), so that a token's operands are the
    accumulators' rows and columns without moving."""
    C = block_d * LR // 32
    row_lanes, col_lanes = bits(LR), bits(32 // LR)
    v = gl.DistributedLinearLayout([[0, r] for r in bits(R)] + [[u, 0] for u in bits(U)],
                                   [[0, R * j] for j in row_lanes] + [[0, 0]] * len(col_lanes),
                                   [[0, R * LR * w] for w in bits(warps)], [], [U, R * LR * warps])
    k = gl.DistributedLinearLayout([[0, c] for c in bits(C)] + [[u, 0] for u in bits(U)],
                                   [[0, 0]] * len(row_lanes) + [[0, C * j] for j in col_lanes],
                                   [[0, 0]] * len(bits(warps)), [], [U, block_d])
    return v, k


@cached_plan
def _lanes_plan(v, k, tiling):
    B, H, D, N = v.shape
    R, LR, warps, bn, U = tiling
    block_d = max(32, triton.next_power_of_2(D))
    grid = (B * H, triton.cdiv(D, R * LR * warps))
    VU, KU = lanes_operand_layouts(R, LR, warps, block_d, U)
    return grid, (H, N, *v.stride(), *k.stride()), dict(D=D, BLOCK_D=block_d, R=R, LR=LR, BN=bn, U=U, VU=VU, KU=KU,
                                                        num_warps=warps)


def lanes_fit(D: int, tiling) -> bool:
    """Whether the lanes kernel takes head_dim ``D`` in this tiling: its rows a program (R * LR *
    warps) a power of two from 8 to 256, at most D rounded up; a row of k at most 256 wide."""
    R, LR, warps = tiling[:3]
    rows = R * LR * warps
    return D <= 256 and 8 <= rows <= max(8, triton.next_power_of_2(D)) and rows & (rows - 1) == 0


def bind_lanes(v, k, value, tiling):
    """:func:`bind`'s launch of the Gluon lanes kernel in ``tiling`` (R, LR, warps, BN, U)."""
    grid, ints, consts = _lanes_plan(v, k, tuple(tiling))
    D = v.shape[2]
    kernel = _linear_attention_scores_lanes_kernel.bind(grid, **consts, enable_fp_fusion=False)
    return fresh_output(kernel, 2, (v.shape[0] * v.shape[1], D + 1, D), ((D + 1) * D, D, 1), torch.float32, *ints,
                        float(value))


def variants(v, k, value) -> list:
    """The kernel, and with Gluon the lanes kernel in each tiling that takes this head_dim,
    labelled, for first sight to verify and time."""
    found = [("dot", bind(v, k, value))]
    if gluon is not None:
        found += [(f"lanes R{t[0]} LR{t[1]} w{t[2]} BN{t[3]} U{t[4]}", bind_lanes(v, k, value, t)) for t in LANES_TILINGS
                  if lanes_fit(v.shape[2], t)]
    return found


def linear_attention_scores(v, k, value):
    """Launch; the caller has checked :func:`can_use`."""
    return bind(v, k, value)(v, k)


LINEAR_ATTENTION_SCORES = Impl(run=linear_attention_scores, supports=supported_layout, bind=bind, variants=variants)
