"""The machine code (SASS, sm_90, compiled on the CPU with Triton's bundled ptxas) of kernels
that call sgdiff's copies of CUDA math: no per-element branch where CUDA's own function takes
one (``div.rn``'s slow path in a bf16 SiLU), and a 16-bit SiLU's instructions an element;
and where silu_mul's eviction hint goes. Their bits against ATen's are
tests/gpu/test_cuda_math_gpu.py's (every input value)."""
import os
import re
import subprocess
import tempfile

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sgdiff.kernels.triton import silu_mul as sk  # noqa: E402
from sgdiff.kernels.triton.cuda_math import INTERPRET, libdevice_options  # noqa: E402

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
pytestmark = [pytest.mark.skipif(not os.path.exists(NVDISASM), reason="this Triton bundles no nvdisasm"),
              pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET=1: kernels are interpreted, not compiled")]


def _compile(kernel, constexprs: dict) -> dict:
    """``kernel`` compiled for sm_90 (its ``asm``, with the SASS under "sass"): bf16 pointers
    and 32-bit ints, all multiples of 16 as at Flux's shapes (a launch specializes on that)."""
    fn = kernel.fn
    sig = {n: "constexpr" if n in constexprs else "*bf16" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n not in constexprs}
    asm = dict(triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=4, enable_fp_fusion=False, **libdevice_options())).asm)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(asm["cubin"])
        f.flush()
        asm["sass"] = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return asm


def _count(sass: str, opcode: str) -> int:
    """Instructions of this opcode (any modifiers) in the SASS."""
    return len(re.findall(rf"\b{opcode}\b", sass))


# SwiGLU's halves of a [rows, 2 * 4096] projection, as a launch compiles them in: rows merged
UNIT = dict(n1=1, n2=1, D=4096, so0=4096, so1=0, so2=0, so3=1, sa0=8192, sa1=0, sa2=0, sa3=1,
            sb0=8192, sb1=0, sb2=0, sb3=1, **{f"s{o}{d}": 0 for o in ("ab", "bb") for d in range(4)})
SWIGLU = dict(UNIT, SILU_DTYPE=tl.bfloat16, HAS_B=True, HAS_BIAS=False, INTERPRET=False, BLOCK_R=1, FLAT=True,
              EVICT="", GELU=False)


def _per_4_elements(opcode: str, **consts) -> int:
    """How many more ``opcode`` instructions a thread runs for 4 more elements (8 a thread
    against 4)."""
    counts = [_count(_compile(sk._silu_mul_kernel, dict(SWIGLU, BLOCK_D=d, **consts))["sass"], opcode)
              for d in (512, 1024)]
    return counts[1] - counts[0]


def test_silu_branches_do_not_grow_with_the_elements():
    """Twice the elements a thread, the same branches: none is taken per element (with
    ``div.rn`` each element's division has one, to its slow path)."""
    assert _per_4_elements("BRA") == 0


@pytest.mark.parametrize("dtype", [tl.bfloat16, tl.float16])
def test_silu_takes_one_comparison_and_two_special_functions_an_element(dtype):
    """A 16-bit SiLU: ``ex2`` and ``rcp`` (MUFU), and one comparison (FSETP: the corrected
    quotient NaN) an element; a scale chosen for large denominators or a check for a zero
    quotient would add one each."""
    assert (_per_4_elements("MUFU", SILU_DTYPE=dtype), _per_4_elements("FSETP", SILU_DTYPE=dtype)) == (8, 4)


def test_eviction_reaches_the_gate_and_its_half_only():
    """EVICT (``_input_eviction``) marks the loads of ``a`` and ``b``, not the biases'."""
    consts = dict(SWIGLU, HAS_BIAS=True, BLOCK_D=1024, sab0=0, sab3=1, sbb0=0, sbb3=1)
    hinted = [_compile(sk._silu_mul_kernel, dict(consts, EVICT=e))["ptx"] for e in ("", "evict_first")]
    assert [len(re.findall(r"ld\.global[.\w:]*evict_first", ptx)) for ptx in hinted] == [0, 2]
    assert [len(re.findall(r"ld\.global", ptx)) for ptx in hinted] == [4, 4]


def test_input_eviction_is_for_inputs_that_fit_in_l2():
    """Sana's GLU reads 45.9 MB (evict-first within a 60 MiB L2, not within 40); SwiGLU's halves
    of 12288 over 4608 tokens, 226 MB, never; without ``b`` (written in place) never."""
    conv = torch.empty(2, 11200, 32, 32, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    hidden, gate = conv.chunk(2, dim=1)
    proj = torch.empty(1, 4608, 2 * 12288, dtype=torch.bfloat16, device="meta")
    a, b = proj.chunk(2, dim=-1)
    l2 = 60 * 2 ** 20
    assert sk._input_eviction(gate, hidden, l2) == "evict_first"
    assert sk._input_eviction(gate, hidden, 40 * 2 ** 20) == ""
    assert sk._input_eviction(a, b, l2) == ""
    assert sk._input_eviction(conv, None, l2) == ""
