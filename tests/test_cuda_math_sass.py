"""The machine code (SASS, sm_90, compiled on the CPU with Triton's bundled ptxas) of kernels
that call sgdiff's copies of CUDA math: no per-element branch where CUDA's own function takes
one (``div.rn``'s slow path in a bf16 SiLU). Their bits against ATen's are
tests/gpu/test_cuda_math_gpu.py's (every input value)."""
import os
import re
import subprocess
import tempfile

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sgdiff.kernels.triton import silu_mul as sk  # noqa: E402
from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options  # noqa: E402

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
pytestmark = [pytest.mark.skipif(not os.path.exists(NVDISASM), reason="this Triton bundles no nvdisasm"),
              pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET=1: kernels are interpreted, not compiled")]


def _branches(kernel, constexprs: dict) -> int:
    """Branch instructions in the SASS of ``kernel``: bf16 pointers and 32-bit ints, all
    multiples of 16 as at Flux's shapes (a launch specializes on that)."""
    fn = kernel.fn
    sig = {n: "constexpr" if n in constexprs else "*bf16" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n not in constexprs}
    cubin = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=4, enable_fp_fusion=False, **libdevice_options())).asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"\bBRA\b", sass))


# SwiGLU's halves of a [rows, 2 * 4096] projection, as a launch compiles them in: rows merged
UNIT = dict(n1=1, n2=1, D=4096, so0=4096, so1=0, so2=0, so3=1, sa0=8192, sa1=0, sa2=0, sa3=1,
            sb0=8192, sb1=0, sb2=0, sb3=1, **{f"s{o}{d}": 0 for o in ("ab", "bb") for d in range(4)})


def test_silu_branches_do_not_grow_with_the_elements():
    """Twice the elements a thread, the same branches: none is taken per element (with
    ``div.rn`` each element's division has one, to its slow path)."""
    consts = dict(UNIT, SILU_DTYPE=tl.bfloat16, HAS_B=True, HAS_BIAS=False, INTERPRET=False, BLOCK_R=1, FLAT=True)
    counts = [_branches(sk._silu_mul_kernel, dict(consts, BLOCK_D=d)) for d in (512, 1024)]
    assert counts[0] == counts[1], counts
