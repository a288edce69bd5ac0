"""Triton kernels run under Triton's CPU interpreter on every commit.

The interpreter computes fp32 like the GPU (fma, correctly rounded division) but truncates
fp32 -> bf16 and has no approximate rsqrt, so bf16 results are compared with a tolerance and
exactness is claimed only on the GPU (tests/gpu).

The tests are in tests/interpreter, marked ``interpreter``; sgdiff.kernels.triton.cuda_math reads
TRITON_INTERPRET at import, so they run in a pytest of their own started with TRITON_INTERPRET=1
(tests/conftest.py skips them in a process without it). Here they are started and counted;
tests/interpreter/conftest.py lists the interpreter's builtins once for the process (a third less
time: the interpreter walks the language's members at every helper call otherwise).
"""
import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

# the tests each module of tests/interpreter holds, from its parametrization
EXPECTED = {
    # the former script's 70 cases: layernorm_modulate 2 dtypes x 4 shapes x 5 argument lists, the row
    # kept or read again 2 dtypes, layer_norm 2 dtypes x 4 head dims x 3 argument lists, Wan's casts 4;
    # then the keep_row choice, Wan's refused casts, the refused layouts; a per-token table's
    # addends with Wan's casts and on fp32 rows; channels-first rows normalized where they lie, 4 geometries
    # x 2 dtypes, and copied first where addends come
    "test_layernorm_modulate_interp.py": 2 * 4 * 5 + 2 + 2 * 4 * 3 + 4 + 3 + 2 + 4 * 2 + 1,
    # residual_gate 2 dtypes x 2 widths x 11 argument lists, residual_add 6 (3 divisors, 3 scales); then the
    # tanh gate, the refused layouts; a per-token gate's addend, plain and tanh; a residual in 2 other memory
    # orders x its update alike or not x 2 gates, and a transposed 2-D one
    "test_residual_gate_interp.py": 2 * 2 * 11 + 6 + 2 + 2 + 2 * 2 * 2 + 1,
    # the former 206, 103 a dtype: rms_norm fused 4 shapes x 2 weights, rope 3 head dims x 2 rotations
    # x 2 layouts, rope_complex 2 and rope_even_odd 1, rms_norm diffusers 6 shapes x 3 weights x 2
    # references and heads-first 1, silu_mul 2 and its epilogues 2, cast_copy 4, linear_attention_out
    # 2 token counts x 2 out dtypes, modulate 3, rmsnorm_modulate 2 and 4 norms x 4 modulations,
    # rms_norm_rope 2 layouts x 2, rms_norm_cat_rope 2, gelu_tanh_cat 4 and its head alone 4; rms_norm_rope's refusals a
    # dtype; rope_matrix 2 layouts x 2 forms; then the refused layouts
    "test_rowwise_interp.py": 2 * (4 * 2 + 3 * 2 * 2 + 2 + 1 + 6 * 3 * 2 + 1 + 2 + 2 + 4 + 2 * 2 + 3 + 2 + 4 * 4
                                   + 2 * 2 + 2 + 4 + 4 + 1 + 2 * 2 + 1 + 1 + 1) + 1,  # ..., gelu_mul, rope's arith and
                                                                                 # complex128 a dtype
    # linear_fp8: the scales at 4 shapes, the weight copies kept, remade and dropped, one quantization
    # for the projections of one input, the copy of weights side by side and the GEMM over it, a modulated
    # norm's rows made e4m3 by its kernel (Flux's and Wan's forms)
    "test_linear_fp8_interp.py": 4 + 3 + 2 + 2,
    # gelu_linear_fp8: the rows of the GELU (and cat) at 5 geometries, the GEMM handed those rows
    "test_gelu_linear_fp8_interp.py": 5 + 1,
    # attention_int8: keys and attention at 4 geometries, e4m3 values and attention at the 4, heads-first
    # inputs, the refusals
    "test_attention_int8_interp.py": 4 + 4 + 1 + 1,
    # attention_fp8's operands at 3 geometries (one heads-first), padded, its output restored; the cuDNN
    # implementation against a frontend computing cuDNN's documented math, at 3 geometries; a geometry's two graphs
    "test_fp8_heads_interp.py": 3 + 1 + 1 + 1 + 3 + 1,
    # rms_norm_heads_rope: 3 rotations x 4 geometries x 2 dtypes, the refusals
    "test_rms_norm_heads_rope_interp.py": 3 * 4 * 2 + 1,
    # the power-of-two reciprocal against IEEE division
    "test_welford_interp.py": 1,
    # the interpreter's builtins listed once (tests/interpreter/interpreter_compat.py): its results, nothing left patched
    "test_interpreter_compat_interp.py": 1,
    # every Triton op's bound launch on its smallest example (33 ops), and that count itself
    "test_binds_interp.py": 35 * 2 + 1,  # each op: a launch reads its call's tensors, holds none of its binding's
    # channel_normalize: 4 geometries (one frame-major) x 2 dtypes x SiLU or not, a scale tensor, the refusals
    "test_channel_normalize_interp.py": 4 * 2 * 2 + 2,
    # cat_pad bit for bit: 6 geometries x 3 dtypes, the pad alone 2 dtypes, strided inputs, the refusals
    "test_cat_pad_interp.py": 6 * 3 + 2 + 1 + 1,
    # the GEMM's every configuration: plain 3 shapes x 2 biases, plain-gated residual 3 shapes x 2 gate
    # paths, the cat operand with an fp32 gate, 3 activations x 2 gate functions within a tolerance, SwiGLU
    # halves 2 geometries x the gate first or second
    "test_gemm_interp.py": 3 * 2 + 3 * 2 + 1 + 3 * 2 + 2 * 2,
    # GroupNorm: 5 fp32 orders, 2 dtypes, the plan, the refusals; the pre-biased norm 3 geometries,
    # the flagged division; the channels-last output 3 geometries, its refusals
    "test_group_norm_interp.py": 5 + 2 + 1 + 1 + 3 + 1 + 3 + 1,
    # conv_residual's epilogue: 3 geometries x 2 dtypes, the refusals; the strided pass 2 geometries x 2 dtypes
    "test_conv_residual_interp.py": 3 * 2 + 1 + 2 * 2,
    # upsample_nearest: 2 geometries x 2 dtypes, the refusals; biased_conv's pass 2 dtypes
    "test_upsample_interp.py": 2 * 2 + 1 + 2,
    # linear_attention_apply in increasing k bit for bit: 3 geometries x 2 dtypes of q, the ReLU's NaN and -0;
    # linear_attention_scores in increasing token order: 3 geometries x 2 dtypes
    "test_linear_attention_matmuls_interp.py": 4 * 2 + 1 + 3 * 2,
}


@pytest.mark.starts_first
def test_interpreter_tests_pass(tmp_path):
    """pytest -m interpreter tests/interpreter under TRITON_INTERPRET=1 (over 2 processes where
    pytest-xdist is installed): every test passes, and every one ran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env["TRITON_INTERPRET"] = "1"
    report = tmp_path / "interpreter.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "interpreter",
           f"--junitxml={report}", str(ROOT / "tests" / "interpreter")]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    tail = out.stderr[-2000:] + out.stdout[-8000:]
    assert out.returncode == 0, tail
    summary = re.findall(r"(\d+) passed", out.stdout)   # the last: the summary line's
    assert summary and int(summary[-1]) >= sum(EXPECTED.values()), tail
    cases = ElementTree.parse(report).iter("testcase")   # classname: tests.interpreter.<module>
    passed = Counter(case.get("classname").rsplit(".", 1)[-1] + ".py" for case in cases
                     if not any(child.tag in ("failure", "error", "skipped") for child in case))
    for module, count in EXPECTED.items():
        assert passed[module] >= count, (module, passed[module], count, tail)
