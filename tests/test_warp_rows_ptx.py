"""The per-head LayerNorm's Gluon kernel, compiled for sm_90 on the CPU (no GPU, no launch):
the structure its bit-exactness rests on, in the PTX the installed Triton emits.

The kernel relies on Triton lowering ``gl.reduce`` over the lane axis to a butterfly whose
offsets run 16, 8, 4, 2, 1 with each lane combining (own, other), so that lane 0 follows
ATen's shuffle-down tree; then on a ``shfl.sync.idx`` from lane 0. A Triton that lowered the
reduction another way would give other bits: this test says so before a GPU does."""
import re

import pytest

tk = pytest.importorskip("sgdiff.kernels.triton.layernorm_modulate")
if tk._layer_norm_warp_rows_kernel is None:
    pytest.skip("this Triton has no Gluon", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402


def _ptx(rows=16, warps=4, dtype="bf16", affine=True):
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "M": "i32",
           "N": "i32", "eps": "fp32", "ROWS": "constexpr", "HAS_WEIGHT": "constexpr", "HAS_BIAS": "constexpr",
           "DTYPE": "constexpr", "INTERPRET": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5)}  # as a launch specializes aligned rows
    tl_dtype = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    src = GluonASTSource(tk._layer_norm_warp_rows_kernel.fn, sig, attrs=attrs, constexprs=dict(
        ROWS=rows, HAS_WEIGHT=affine, HAS_BIAS=affine, DTYPE=tl_dtype, INTERPRET=False))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "enable_fp_fusion": False}).asm["ptx"]


@pytest.mark.parametrize("rows,warps,dtype,affine", [(16, 4, "bf16", True), (32, 8, "fp32", False), (8, 4, "fp16", True)])
def test_lane_tree_is_lane_zeros_shuffle_down_path(rows, warps, dtype, affine):
    ptx = _ptx(rows, warps, dtype, affine)
    assert not re.search(r"(ld|st)\.shared|bar\.sync", ptx)  # all within a warp's registers
    offsets = [int(o) for o in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", ptx)]
    states = 3 * rows // warps  # mean, m2, count for each row a warp holds
    assert len(offsets) == 5 * states
    # a row's three states climb the tree together: 16, 8, 4, 2, 1, never another order
    for row in range(rows // warps):
        assert offsets[15 * row:15 * (row + 1)] == [o for o in (16, 8, 4, 2, 1) for _ in range(3)]
    # the first combine: delta = own.mean - other.mean, with other the shuffled value
    shfl = re.search(r"shfl\.sync\.bfly\.b32\s+(%r\d+), (%r\d+), 16,", ptx)
    sub = re.search(r"sub\.rn\.f32\s+%r\d+, (%r\d+), (%r\d+);", ptx[shfl.end():])
    assert sub.groups() == (shfl.group(2), shfl.group(1))
    assert ptx.count("shfl.sync.idx.b32") == states  # lane 0's state to every lane
    # vector loads and stores of a lane's 4 elements
    width = {"bf16": "v2.b32", "fp16": "v2.b32", "fp32": "v4.b32"}[dtype]
    assert re.search(rf"ld\.global(\.[a-z0-9]+)*\.{width}", ptx) and re.search(rf"st\.global(\.[a-z0-9]+)*\.{width}", ptx)
