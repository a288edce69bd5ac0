"""sgdiff's Gluon LayerNorm kernels on the CPU (no GPU): compiled for sm_90, the structure
their bit-exactness rests on, in the PTX the installed Triton emits; which rows take them; and
the fall back to the Triton kernels where they cannot run.

The per-head kernel takes shuffle-down's first two levels (offsets 16, 8) in a thread's
registers and relies on Triton lowering ``gl.reduce`` over a row's 8 lanes to a butterfly
whose offsets run 4, 2, 1 with each lane combining (own, other), so that a row's first lane
follows ATen's shuffle-down tree; then on a ``shfl.sync.idx`` from that lane. The warp-row
kernel (a long row a warp) relies on the same for its 16 lanes (8, 4, 2, 1) and then on one
shuffle at offset 16 for ATen's last cross-warp step. A Triton that lowered the reduction
another way would give other bits: these tests say so before a GPU does."""
import re

import pytest

import logging

import torch

tk = pytest.importorskip("sgdiff.kernels.triton.layernorm_modulate")
tln = pytest.importorskip("sgdiff.kernels.triton.layer_norm")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

needs_gluon = pytest.mark.skipif(tln._layer_norm_warp_rows_kernel is None, reason="this Triton has no Gluon")


def _ptx(rows=16, warps=4, dtype="bf16", affine=True, pow2=True, even=False):
    """PTX of a launch on rows of 128 (pow2) or 72 elements (``even``: M a multiple of rows)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "M": "i32",
           "N": "constexpr", "eps": "fp32", "ROWS": "constexpr", "HAS_WEIGHT": "constexpr", "HAS_BIAS": "constexpr",
           "DTYPE": "constexpr", "INTERPRET": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3)}  # as a launch specializes aligned rows
    tl_dtype = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    sig["LAYOUT"] = sig["POW2"] = sig["EVEN_ROWS"] = "constexpr"
    src = GluonASTSource(tln._layer_norm_warp_rows_kernel.fn, sig, attrs=attrs, constexprs=dict(
        N=128 if pow2 else 72, ROWS=rows, HAS_WEIGHT=affine, HAS_BIAS=affine, DTYPE=tl_dtype, INTERPRET=False,
        LAYOUT=tln.warp_rows_layout(rows, warps), POW2=pow2, EVEN_ROWS=even))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "enable_fp_fusion": False}).asm["ptx"]


@needs_gluon
@pytest.mark.parametrize("rows,warps,dtype,affine,pow2,even", [(16, 4, "bf16", True, True, False),
                                                             (16, 2, "bf16", True, True, True),
                                                             (64, 8, "fp32", False, True, False),
                                                             (32, 4, "fp16", True, False, True)])
def test_lane_tree_is_the_first_lanes_shuffle_down_path(rows, warps, dtype, affine, pow2, even):
    ptx = _ptx(rows, warps, dtype, affine, pow2, even)
    assert not re.search(r"(ld|st)\.shared|bar\.sync", ptx)  # all within a warp's registers
    offsets = [int(o) for o in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", ptx)]
    sets = rows // (4 * warps)  # rows a lane holds in registers
    # each row's three states (mean, m2, count) climb the butterfly together: 4, 2, 1
    assert offsets == [o for _ in range(sets) for o in (4, 2, 1) for _ in range(3)]
    # the first butterfly combine: delta = own.mean - other.mean, with other the shuffled value
    shfl = re.search(r"shfl\.sync\.bfly\.b32\s+(%r\d+), (%r\d+), 4,", ptx)
    sub = re.search(r"sub\.rn\.f32\s+%r\d+, (%r\d+), (%r\d+);", ptx[shfl.end():])
    assert sub.groups() == (shfl.group(2), shfl.group(1))
    # the segment's first lane's state to its 8 lanes: segment mask 0x18, clamp 31
    assert ptx.count("shfl.sync.idx.b32") == 3 * sets
    assert len(re.findall(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, 0, 0x181f, -1;", ptx)) == 3 * sets
    # vector loads and stores of a thread's 4 elements
    width = {"bf16": "v2.b32", "fp16": "v2.b32", "fp32": "v4.b32"}[dtype]
    assert re.search(rf"ld\.global(\.[\w:]+)*\.{width}", ptx) and re.search(rf"st\.global(\.[a-z0-9]+)*\.{width}", ptx)


@needs_gluon
@pytest.mark.parametrize("affine", [True, False])
def test_per_head_rows_are_read_evict_first(affine):
    """q or k, dead after their norm, is read evict-first: a thread's 8 vectors (16 rows of 128
    on 2 warps); the weight and bias, which every row reads, keep the default policy."""
    loads = re.findall(r"ld\.global\S*", _ptx(16, 2, "bf16", affine))
    assert [sum("evict_first" in ld for ld in loads), len(loads)] == [8, 24 if affine else 8]


@needs_gluon
def test_power_of_two_counts_leave_the_tree_without_divisions():
    """Rows of 4 * 2**k: every combine (the tree's and the two with empty warps) takes
    1 / count from its bits, and the variance is m2 times 1 / N: no division is left. Other
    rows: each combine's reciprocal is div.rn's fast path (an rcp, no branch), and the
    variance one IEEE division."""
    other, pow2 = _ptx(pow2=False), _ptx(pow2=True)
    sets = 16 // (4 * 4)
    assert not re.search(r"div\.rn\.f32|rcp\.", pow2)
    assert len(re.findall(r"div\.rn\.f32", other)) == sets
    assert len(re.findall(r"rcp\.approx\.ftz\.f32", other)) == 7 * sets


class _Kernel:
    """A stand-in for a LeanKernel: records its launches, or raises as a failed compile does."""

    def __init__(self, error=None):
        self.error, self.launches, self.options = error, 0, []

    def bind(self, grid, **options):
        self.options.append(options)

        def launch(*args):
            if self.error is not None:
                raise self.error
            self.launches += 1
        return launch


@needs_gluon  # the options of its launch are built with Gluon
def test_a_gluon_kernel_that_fails_to_compile_leaves_the_triton_kernel(monkeypatch, caplog):
    gluon, plain = _Kernel(triton.compiler.errors.CompilationError("", None, "gluon differs")), _Kernel()
    monkeypatch.setattr(tln, "_layer_norm_warp_rows_kernel", gluon)
    monkeypatch.setattr(tln, "_layer_norm_short_rows_kernel", plain)
    monkeypatch.setattr(tk, "INTERPRET", False)
    monkeypatch.setattr(tk, "_gluon_failed", [])
    x = torch.randn(2, 5, 3, 64)
    launch = tln.layer_norm_bind(x, None, None, 1e-6)
    with caplog.at_level(logging.WARNING, logger="sgdiff"):
        assert launch(x, None, None).shape == x.shape
        launch(x, None, None)
    assert plain.launches == 2 and gluon.options[0]["ROWS"] == tln.WARP_ROWS_PROGRAM[0]
    assert "Gluon kernel for rows of 64 failed" in caplog.text and len(tk._gluon_failed) == 1
    tln.layer_norm_bind(x, None, None, 1e-6)(x, None, None)  # later signatures skip the Gluon kernel
    assert len(gluon.options) == 1 and plain.launches == 3


@needs_gluon
def test_a_gluon_kernel_that_runs_is_kept(monkeypatch):
    gluon, plain = _Kernel(), _Kernel()
    monkeypatch.setattr(tln, "_layer_norm_warp_rows_kernel", gluon)
    monkeypatch.setattr(tln, "_layer_norm_short_rows_kernel", plain)
    monkeypatch.setattr(tk, "INTERPRET", False)
    monkeypatch.setattr(tk, "_gluon_failed", [])
    x = torch.randn(7, 128)
    launch = tln.layer_norm_bind(x, torch.randn(128), None, 1e-6)
    for _ in range(3):
        launch(x, None, None)
    assert gluon.launches == 3 and plain.launches == 0 and not tk._gluon_failed


def _warp_row_ptx(rows=1, warps=1, dtype="bf16", iters=3, affine=False, even_rows=True, N=None, group=1,
                  s_const=0, ahead=0, early=0):
    from triton.experimental.gluon._runtime import GluonASTSource
    fn = tk._layernorm_modulate_warp_row_kernel.fn
    tl_dtype = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    const = dict(ITERS=iters, HAS_WEIGHT=affine, HAS_BIAS=affine, HAS_SHIFT=True, PLUS_ONE=True, DTYPE=tl_dtype,
                 INTERPRET=False, HAS_SCALE=True, ROWS=rows, LAYOUT=tk.warp_row_layout(rows, warps),
                 EVEN_ROWS=even_rows, N=N or {1: 448, 3: 1152, 5: 2240}[iters], GROUP=group,  # rows with a partial tile
                 S_CONST=s_const, AHEAD=ahead, EARLY=early)
    const["TREE"] = tk.warp_row_tree_terms(const["N"])
    sig = {n: "constexpr" if n in const else f"*{dtype}" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32"
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n.endswith("_ptr")}
    return triton.compile(GluonASTSource(fn, sig, attrs=attrs, constexprs=const), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "enable_fp_fusion": False}).asm["ptx"]


@needs_gluon
@pytest.mark.parametrize("affine", [False, True])
def test_warp_row_second_pass_groups_its_loads(affine):
    """With GROUP = ITERS every global load of the second pass goes out before the first store;
    tile by tile, loads follow stores (the compiler never hoists a load over a store)."""
    assert _loads_before_first_store(_warp_row_ptx(iters=5, affine=affine, group=5))
    assert not _loads_before_first_store(_warp_row_ptx(iters=5, affine=affine, group=1))
    assert not _loads_before_first_store(_warp_row_ptx(iters=5, affine=affine, group=2))  # tiles 0-1, 2-3, 4


@needs_gluon
@pytest.mark.parametrize("affine", [False, True])
def test_warp_row_second_pass_sends_loads_ahead(affine):
    """AHEAD = 1: a tile's loads go out before the previous tile's stores; EARLY = n: the
    first n tiles' loads go out before the statistics' shuffles. One tile's loads: those between
    the statistics and the first store, tile by tile."""
    plain = _warp_row_ptx(iters=5, affine=affine)
    tile = _loads_before(plain, "st") - _loads_before(plain, "shfl")
    assert tile > 0  # x read again, scale, shift (weight, bias)
    assert _loads_before(_warp_row_ptx(iters=5, affine=affine, ahead=1), "st") == _loads_before(plain, "st") + tile
    for early in (1, 2):
        ptx = _warp_row_ptx(iters=5, affine=affine, ahead=1, early=early)
        assert _loads_before(ptx, "shfl") == _loads_before(plain, "shfl") + early * tile
        assert _loads_before(ptx, "st") == _loads_before(plain, "st") + tile  # still one tile ahead


def _loads_before(ptx: str, op: str) -> int:
    """Global loads in a kernel's PTX before its first ``op`` (``st``: global store; ``shfl``)."""
    ops = re.findall(r"\b(ld\.global|st\.global|shfl\.sync)", ptx)
    return ops[:next(i for i, o in enumerate(ops) if o.startswith(op))].count("ld.global")


def _loads_before_first_store(ptx: str) -> bool:
    """Whether every global load of a kernel's PTX comes before its first global store."""
    return _loads_before(ptx, "st") == len(re.findall(r"\bld\.global", ptx))


@needs_gluon
def test_warp_row_batch_index_with_s_compiled_in():
    """S compiled in: the batch index is an unsigned multiply, no division; at run time, a division."""
    assert not re.search(r"\b(div|rem)\.", _warp_row_ptx(s_const=1000).split("sub.rn.f32")[0])
    assert re.search(r"\b(div|rem)\.s32", _warp_row_ptx(s_const=0))


@needs_gluon
@pytest.mark.parametrize("rows,warps,dtype,iters,affine,even_rows", [
    (1, 1, "bf16", 3, False, True), (4, 4, "fp16", 5, True, False), (2, 1, "fp32", 1, False, True)])
def test_warp_row_tree_is_atens_order(rows, warps, dtype, iters, affine, even_rows):
    ptx = _warp_row_ptx(rows, warps, dtype, iters, affine, even_rows)
    assert not re.search(r"(ld|st)\.shared|bar\.sync", ptx)  # a row within a warp's registers
    offsets = [int(o) for o in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", ptx)]
    sets = rows // warps  # rows a lane holds in registers
    # per row: the 16 lanes of lo for a = 0 and a = 1 (mean and m2 each: 8, 4, 2, 1), then b at
    # 16; no count is shuffled (rows held together interleave theirs, the 16s last)
    tree = [o for o in [8, 4, 2, 1] * 2 + [16] for _ in range(2)]
    assert sorted(offsets) == sorted(tree * sets) and offsets[-2 * sets:] == [16] * 2 * sets
    shfl = re.search(r"shfl\.sync\.bfly\.b32\s+(%r\d+), (%r\d+), 8,", ptx)
    sub = re.search(r"sub\.rn\.f32\s+%r\d+, (%r\d+), (%r\d+);", ptx[shfl.end():])
    assert sub.groups() == (shfl.group(2), shfl.group(1))  # (own, other)
    # lane 0's mean and m2 to the whole warp
    assert len(re.findall(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, 0, 0x1f, -1;", ptx)) == 2 * sets
    # every count on the tree's path compiled in: no reciprocal; one IEEE division, the variance
    assert not re.search(r"rcp\.", ptx)
    assert len(re.findall(r"div\.rn\.f32", ptx)) == sets


def _shuffle_down_terms(N):
    """The count terms of the combines that reach thread 0 in ATen's block of 128 threads, from
    its counts alone: ``{(level, warp): {terms}}``, levels as in warp_row_tree_terms. Each
    term is computed as welford_combine computes it: fp32 products with 1 / n rounded to fp32."""
    f32 = torch.float32
    n_vec, iters = N // 4, -(-N // 512)
    count = [4 * sum(1 for k in range(iters) if t + 128 * k < n_vec) for t in range(128)]

    def terms(own, oth):
        n = torch.tensor(float(own + oth), dtype=f32)
        coef = torch.tensor(1.0, dtype=f32) / n
        return (float(torch.tensor(float(oth), dtype=f32) * coef), float(torch.tensor(float(own), dtype=f32) * coef),
                float(oth), bool(n > 0)) if own + oth else (0.0, 0.0, 0.0, False)

    seen = {}
    for w in range(4):  # a warp's shuffle-down: lane i < offset takes lane i + offset, and feeds lane 0
        lanes = count[32 * w:32 * w + 32]
        for level, offset in enumerate((16, 8, 4, 2, 1)):
            for i in range(offset):
                seen.setdefault((level, w), set()).add(terms(lanes[i], lanes[i + offset]))
            lanes = [lanes[i] + lanes[i + offset] if i < offset else lanes[i] for i in range(32)]
        count[32 * w] = lanes[0]
    warp = [count[32 * w] for w in range(4)]
    for b in range(2):
        seen[(5, b)] = {terms(warp[b], warp[b + 2])}
    seen[(6, 0)] = {terms(warp[0] + warp[2], warp[1] + warp[3])}
    return seen


@pytest.mark.parametrize("N", [64, 448, 1152, 1536, 2240, 2432, 3072, 5120, 64 * 47])
def test_warp_row_tree_terms_are_atens(N):
    """The table the warp-row kernel compiles in: for every combine on thread 0's path of ATen's
    tree, the terms its counts give; and only one set of terms a level and warp (the kernel
    applies them to every lane of a half-warp)."""
    from sgdiff.kernels.triton.welford import warp_row_tree_terms
    table, seen = warp_row_tree_terms(N), _shuffle_down_terms(N)
    for (level, w), terms in seen.items():
        assert len(terms) == 1, (level, w, terms)
        a, b = (w // 2, w % 2) if level < 5 else (0, w)
        assert table[level][a][b] == next(iter(terms)), (level, w)


def test_warp_row_tree_terms_differ_with_the_row():
    """A near miss: another row length's table (other counts on the path) is another table, and
    rows whose counts differ within a half-warp have none."""
    from sgdiff.kernels.triton.welford import warp_row_tree_terms
    assert warp_row_tree_terms(2240) != warp_row_tree_terms(2176)
    assert any(len(t) > 1 for t in _shuffle_down_terms(2240 + 4).values())
    with pytest.raises(AssertionError):
        warp_row_tree_terms(2240 + 4)


@needs_gluon
@pytest.mark.parametrize("affine", [False, True])
def test_warp_row_full_tiles_load_unmasked(affine):
    """Where every row is in the grid, the tiles that lie in the row load and store without a
    mask (a masked load zeroes its registers first); a partial last tile keeps its mask, and
    so does every tile of a grid whose last program may pass the last row."""
    def accesses(ptx):  # (masked, unmasked) global loads and stores
        ops = re.findall(r"^\s*(@%p\d+ )?(?:ld|st)\.global", ptx, re.M)
        return sum(1 for p in ops if p), sum(1 for p in ops if not p)
    assert accesses(_warp_row_ptx(1, 1, "bf16", 2, affine, even_rows=True, N=1024))[0] == 0  # 2 full tiles
    masked, unmasked = accesses(_warp_row_ptx(1, 1, "bf16", 3, affine, even_rows=True))  # 1152: the third partial
    assert 0 < masked < unmasked
    assert accesses(_warp_row_ptx(1, 1, "bf16", 3, affine, even_rows=False))[1] == 0


def _modulate_kernels(monkeypatch, gluon_error=None):
    gluon, plain = _Kernel(gluon_error), _Kernel()
    monkeypatch.setattr(tk, "_layernorm_modulate_warp_row_kernel", gluon)
    monkeypatch.setattr(tk, "_layernorm_modulate_kernel", plain)
    monkeypatch.setattr(tk, "INTERPRET", False)
    monkeypatch.setattr(tk, "_gluon_failed", [])
    return gluon, plain


def _modulate_once(B, S, N):
    x, s = torch.randn(B, S, N), torch.randn(B, 1, N)
    tk.bind(x, None, None, 1e-6, s, s)(x, None, None, 1e-6, s, s)


@needs_gluon
def test_short_rows_take_the_warp_row_kernel(monkeypatch):
    gluon, plain = _modulate_kernels(monkeypatch)
    _modulate_once(2, 1024, 2240)  # Sana: 2048 rows of 5 vectors a thread
    _modulate_once(1, 32760, 1536)  # Wan 2.1 1.3B: many rows of 3
    _modulate_once(1, 64, 3072)  # Flux: 6 vectors a thread
    assert gluon.launches == 3 and plain.launches == 0
    assert [o["ROWS"] for o in gluon.options] == [tk.WARP_ROW_PROGRAM[0]] * 3
    assert gluon.options[0]["num_warps"] == tk.WARP_ROW_PROGRAM[1] and gluon.options[0]["ITERS"] == 5
    _modulate_once(1, 64, 3076)  # 7 vectors a thread
    _modulate_once(1, 8, 5120)  # Wan-14B: 10
    _modulate_once(2, 7, 2244)  # 5 vectors a thread, but N % 64 != 0: counts that differ along a half-warp
    assert gluon.launches == 3 and plain.launches == 3


@needs_gluon
def test_warp_row_second_pass_plan(monkeypatch):
    """The row is kept where the grid fits one wave (with S at run time), for rows of up to 5
    vectors a thread with its tiles' loads one tile ahead of their stores and the first tile's
    before the statistics (the first two without an affine LayerNorm), at most 128 registers a
    thread (6 vectors: affine rows tile by tile, others read again, as before); other grids of
    few waves group their second pass's loads, Flux's rows of 6 vectors two tiles at a time, and
    grids of many waves go tile by tile; S is compiled in wherever the row is read again."""
    gluon, plain = _modulate_kernels(monkeypatch)
    monkeypatch.setattr(tk, "_sm_count", lambda device: 132)  # an H200's

    def plan(B, S, N, affine):
        x, s, w = torch.randn(B, S, N), torch.randn(B, 1, N), torch.randn(N) if affine else None
        tk.bind(x, w, w, 1e-6, s, s)(x, w, w, 1e-6, s, s)
        options = gluon.options[-1]
        return tuple(options.get(k, 0) for k in ("KEEP_ROW", "GROUP", "S_CONST", "AHEAD", "EARLY", "maxnreg"))
    assert plan(2, 1024, 2240, True) == (True, 1, 0, 1, 1, 128)  # Sana's 2048 rows
    assert plan(2, 1024, 2240, False) == (True, 1, 0, 1, 2, 128)
    assert plan(2, 4096, 1152, True) == (False, 3, 4096, 0, 0, 0)  # PixArt's 8192 rows: more than 16 a multiprocessor
    assert plan(1, 4608, 3072, False) == (False, 2, 4608, 0, 0, 0)  # Flux: 6 vectors a thread
    assert plan(1, 4608, 3072, True) == (False, 1, 4608, 0, 0, 0)
    assert plan(1, 32760, 1536, False) == (False, 1, 32760, 0, 0, 0)  # Wan 2.1 1.3B: more than 64 a multiprocessor
    assert plan(1, 1024, 3072, True) == (True, 1, 0, 0, 0, 0)  # one wave of Flux-wide rows: 6 vectors spill at 128
    assert plan(1, 1024, 3072, False) == (False, 2, 1024, 0, 0, 0)
    assert plan(1, 16 * 132, 1152, True)[0] and not plan(1, 16 * 132 + 1, 1152, True)[0]
    assert plan(1, 16 * 132, 1152, False)[0] and not plan(1, 16 * 132 + 1, 1152, False)[0]
    assert plan(1, 64 * 132, 1152, False)[1] == 3 and plan(1, 64 * 132 + 1, 1152, False)[1] == 1


def test_four_warp_kernel_groups_its_loads_unless_it_keeps_the_row(monkeypatch):
    """Rows the warp-row kernel does not take (Wan-14B's 10 vectors a thread) load all their
    second-pass tiles before the first store, unless the row is kept in registers."""
    fn = tk._layernorm_modulate_kernel.fn
    gluon, plain = _modulate_kernels(monkeypatch)
    for dtype in (torch.bfloat16, torch.float32):  # an fp32 row is kept
        x, s = torch.randn(1, 32760, 5120, dtype=dtype), torch.randn(1, 1, 5120, dtype=dtype)
        tk.bind(x, None, None, 1e-6, s, s)(x, None, None, 1e-6, s, s)
    assert [(o["KEEP_ROW"], o["GROUP"]) for o in plain.options] == [(False, 10), (True, 1)]

    def ptx(group):
        from triton.compiler import ASTSource
        const = dict(N=5120, ITERS=10, HAS_WEIGHT=True, HAS_BIAS=True, HAS_SHIFT=True, PLUS_ONE=True,
                     DTYPE=tl.bfloat16, INTERPRET=False, HAS_SCALE=True, KEEP_ROW=False, GROUP=group,
                     HAS_SCALE_ADD=False, HAS_SHIFT_ADD=False)
        sig = {n: "constexpr" if n in const else "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32"
               for n in fn.arg_names}
        return triton.compile(ASTSource(fn, sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "enable_fp_fusion": False}).asm["ptx"]
    assert _loads_before_first_store(ptx(10)) and not _loads_before_first_store(ptx(1))


@needs_gluon
def test_layer_norm_plans_on_the_rows_device(monkeypatch):
    """layer_norm binds the rows as a meta tensor: the plan takes the input's device."""
    seen = []
    monkeypatch.setattr(tk, "_sm_count", lambda device: seen.append(device) or 132)
    gluon, plain = _modulate_kernels(monkeypatch)
    x = torch.randn(3, 5, 1152)
    tln.layer_norm_bind(x, None, None, 1e-6)(x, None, None)
    assert seen and all(d.type == "cpu" for d in seen)


@needs_gluon
def test_a_warp_row_kernel_that_fails_to_compile_leaves_the_triton_kernel(monkeypatch, caplog):
    gluon, plain = _modulate_kernels(monkeypatch, triton.compiler.errors.CompilationError("", None, "gluon differs"))
    x, s = torch.randn(2, 5, 1152), torch.randn(2, 1, 1152)
    launch = tk.bind(x, None, None, 1e-6, s, s)
    with caplog.at_level(logging.WARNING, logger="sgdiff"):
        for _ in range(2):
            assert launch(x, None, None, 1e-6, s, s).shape == x.shape
    assert plain.launches == 2 and len(gluon.options) == 1
    assert "layernorm_modulate's Gluon kernel for rows of 1152 failed" in caplog.text and len(tk._gluon_failed) == 1
    _modulate_once(2, 7, 2240)  # later signatures skip the Gluon kernel
    assert len(gluon.options) == 1 and plain.launches == 3
