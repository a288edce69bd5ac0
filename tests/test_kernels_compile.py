"""Every Triton op's launches, at model signatures, compile for sm_90 on the CPU (Triton's
bundled ptxas). The interpreter runs a kernel's logic but never compiles it: code the
interpreter accepts can still fail Triton's compiler (a helper whose constexpr branches return
tiles of different ranks did, in the fused RMSNorm's modulation). Nothing is launched: each
launch a call would make is recorded, its arguments typed as Triton's launch types them, and
compiled. Bits and speed are tests/gpu's.

Every kernel is launched as a programmatic dependent launch on Hopper, so each must wait for
the kernel before it (``griddepcontrol.wait``, SASS ``ACQBULK``) before its first global load
or store: checked in the machine code of each."""
import os
import re
import subprocess
import tempfile

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sgdiff.kernels import registry  # noqa: E402
from sgdiff.kernels.triton.cuda_math import INTERPRET  # noqa: E402
from sgdiff.kernels.triton.attention_int8 import CONFIGS as ATTENTION_CONFIGS  # noqa: E402
from sgdiff.kernels.triton.gemm import GLU_CONFIGS  # noqa: E402
from sgdiff.kernels.triton.launch import LeanKernel  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
pytestmark = [pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton bundles no ptxas"),
              pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET=1: kernels are interpreted, not compiled")]

POINTER = {torch.float8_e4m3fn: "*fp8e4nv", torch.int8: "*i8", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
           torch.float64: "*fp64", torch.int32: "*i32",
           torch.int64: "*i64", torch.uint8: "*u8", torch.bool: "*i1"}


def recorded_launches(monkeypatch, call):
    """``[(kernel, args, kwargs)]``: the LeanKernel launches ``call()`` makes, none of them run."""
    launches = []

    def launcher(kernel, kwargs):
        return lambda *args, **more: launches.append((kernel, args, {**kwargs, **more}))

    monkeypatch.setattr(LeanKernel, "bind", lambda self, grid, **kwargs: launcher(self, kwargs))
    monkeypatch.setattr(LeanKernel, "__getitem__", lambda self, grid: launcher(self, {}))
    call()
    return launches


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return POINTER[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def compile_launch(kernel: LeanKernel, args: tuple, kwargs: dict, arch: int = 90):
    """The launch compiled for sm_<arch> (sm_90 unless told) as a launch specializes it:
    16-byte aligned pointers and integers that are multiples of 16 marked divisible by 16,
    integers equal to 1 compiled in (a unit stride), as are constexprs and None arguments; other
    integers as i32 (i64 past its range), floats as fp32."""
    names = kernel._names
    values = {**kernel._defaults, **dict(zip(names, args)), **{n: v for n, v in kwargs.items() if n in names}}
    if "INTERPRET" in names:
        values["INTERPRET"] = False
    declared = {p.name for p in kernel.fn.params if p.is_constexpr}
    constexprs = {n: values[n] for n in names if n in declared or values[n] is None
                  or (type(values[n]) is int and values[n] == 1)}  # a launch compiles in an int of 1
    sig = {n: "constexpr" if n in constexprs else _arg_type(values[n]) for n in names}
    divisible = [i for i, n in enumerate(names) if n not in constexprs and (
        values[n].data_ptr() % 16 == 0 if isinstance(values[n], torch.Tensor)
        else not isinstance(values[n], (bool, float)) and values[n] % 16 == 0)]
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    options = {n: v for n, v in kwargs.items() if n not in names}
    fn = kernel.fn
    if type(fn).__name__.startswith("Gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        source = ASTSource
    return triton.compile(source(fn, sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


def _target(arch: int):
    """``target_info.current_target`` for a device of this compute capability."""
    def current_target():
        return GPUTarget("cuda", arch, 32)

    current_target.__triton_builtin__ = True  # Triton calls it while compiling
    return current_target


@pytest.fixture(scope="module", autouse=True)
def sm90(tmp_path_factory):
    """Compiles here see an sm_90 device, as a launch on an H200 does (kernels ask the current
    target whether they may wait for the previous grid; on a CPU there is none), in a cache of
    their own (a kernel compiled earlier without a device would be found under the same key)."""
    import triton.language.target_info as target_info

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(target_info, "current_target", _target(90))
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        yield


GLOBAL_MEMORY = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(LDG|STG|LD|ST|ATOMG?|RED|LDGSTS|UTMALDG|UTMASTG|UBLKCP)\b",
                           re.M)


def machine_code(compiled) -> str:
    """The SASS of a compiled kernel (Triton's bundled nvdisasm)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout


def assert_waits_before_memory(kernel: LeanKernel, compiled):
    """The kernel's first global load or store comes after ``griddepcontrol.wait`` (ACQBULK)."""
    sass = machine_code(compiled)
    first = GLOBAL_MEMORY.search(sass)
    assert first, f"{kernel.__name__}: no global load or store"
    wait = sass.find("ACQBULK")
    assert 0 <= wait < first.start(), f"{kernel.__name__}: {first.group(1)} before the grid dependency wait"


def _r(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


EPILOGUES = {"conv_silu", "conv_silu_mul", "conv_group_norm", "conv_residual", "biased_conv"}  # whether cuDNN runs the
# convolution needs a GPU: their epilogues on a bias-free output below


def _triton_ops():
    return [o for o in registry.ops() if any(s.backend == "triton" for s in registry.kernel_specs(o.name))]


def _cases():
    """Every example of every op with a Triton implementation (what the op module declares,
    what models and the bench meet), at its small sizes."""
    return [pytest.param(op.name, example, id=f"{op.name}: {example.label}")
            for op in _triton_ops() if op.name not in EPILOGUES for example in op.examples]


def test_every_triton_op_has_examples():
    assert not [op.name for op in _triton_ops() if not op.examples]
    assert len(_cases()) >= 50


@pytest.mark.parametrize("op,example", _cases())
def test_launch_compiles_for_sm90(monkeypatch, op, example):
    impl = registry.op_def(op).triton_impl()
    args = example.args(small=True)
    assert impl.supports is None or impl.supports(*args), "the kernel refuses its own example"
    launches = recorded_launches(monkeypatch, lambda: impl.run(*args))
    assert launches, f"{op} launched no Triton kernel"
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert compiled.asm["cubin"], kernel.__name__
        assert_waits_before_memory(kernel, compiled)


def _conv_epilogue(kind):
    """A convolution epilogue's launch on a bias-free output ``y`` (and what else it reads)."""
    from sgdiff.kernels.triton import biased_conv as bc, conv_residual as cr, group_norm as gn, silu_mul as sm

    channels = 128 if kind == "silu_mul" else 64
    y, bias = _r(2, channels, 16, 16), _r(channels)
    if kind in ("silu", "silu_mul"):
        y = y.to(memory_format=torch.channels_last)
        bind = sm.bias_silu_mul_bind if kind == "silu_mul" else sm.bias_silu_bind
        return lambda: bind(y, bias)(y, bias)
    last = y.to(memory_format=torch.channels_last)  # the output of a convolution of a channels-last map
    if kind.startswith("group_norm"):  # a map whose batches cross one channel boundary at most, and not;
        y = _r(1, 32, 64, 128) if kind == "group_norm_span" else last if kind == "group_norm_cl" else y
        w, b = _r(y.shape[1]), _r(y.shape[1])  # and one written contiguous by the bias's pass, out channels-last
        cl = kind == "group_norm_cl"
        return lambda: gn._bind_pre_biased(y, bias[:y.shape[1]], w, b, 32, 1e-6, True, cl, cl)(y, bias[:y.shape[1]], w, b)
    if kind == "biased_conv":
        return lambda: bc.bind_epilogue(last, bias, True)(last, bias, True)
    r = _r(*y.shape)
    y = last if kind == "residual_cl" else y
    return lambda: cr.bind_epilogue(y, bias, r, 2.0)(y, bias, r)


@pytest.mark.parametrize("kind", ["silu", "silu_mul", "group_norm", "group_norm_span", "group_norm_cl", "residual",
                                  "residual_cl", "biased_conv"])
def test_conv_epilogue_compiles_for_sm90(monkeypatch, kind):
    launches = recorded_launches(monkeypatch, _conv_epilogue(kind))
    assert launches
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert compiled.asm["cubin"]
        assert_waits_before_memory(kernel, compiled)


def test_depthwise_glu_compiles_for_sm90_in_every_tiling(monkeypatch):
    """conv_silu_mul's depthwise kernel (Sana's 3x3 filter over a channels-last map), each tiling
    first sight tries."""
    from sgdiff.kernels.triton import depthwise_conv as dw

    x, w, b = _r(2, 64, 16, 16).to(memory_format=torch.channels_last), _r(64, 1, 3, 3), _r(64)
    geometry = ([1, 1], [1, 1], [1, 1], 64)
    launches = recorded_launches(monkeypatch, lambda: [fn(x, w, b, *geometry) for _, fn in dw.variants(x, w, b, *geometry)])
    assert len(launches) == len(dw.variants(x, w, b, *geometry)) > 1
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert compiled.asm["cubin"]
        assert_waits_before_memory(kernel, compiled)


def test_before_hopper_a_kernel_waits_for_nothing(monkeypatch):
    """sm_80 has no griddepcontrol: there the kernel compiles without it."""
    import triton.language.target_info as target_info

    from sgdiff.kernels.triton import residual_gate as trg

    monkeypatch.setattr(target_info, "current_target", _target(80))
    x, gate = _r(2, 64, 3072), _r(2, 1, 3072)
    launches = recorded_launches(monkeypatch, lambda: trg.residual_gate(x, gate, x, "plain"))
    (kernel, largs, kwargs), = launches
    compiled = compile_launch(kernel, largs, kwargs, arch=80)
    assert "griddepcontrol" not in compiled.asm["ptx"]
    monkeypatch.setattr(target_info, "current_target", _target(90))
    assert "griddepcontrol.wait" in compile_launch(kernel, largs, kwargs).asm["ptx"]  # on sm_90 it waits


@pytest.mark.parametrize("d,config", [(d, c) for d, configs in ATTENTION_CONFIGS.items() for c in configs])
def test_every_attention_int8_configuration_compiles_within_an_h200s_shared_memory(monkeypatch, d, config):
    """First sight times every configuration: each compiles for sm_90 and fits in 227 KiB; the
    scores are an INT8 ``wgmma`` (IGMMA) and ``P @ v`` a bf16 (HGMMA) or e4m3 (QGMMA) one; with
    TMA the keys and values come by bulk tensor copies (UTMALDG)."""
    from sgdiff.kernels.triton import attention_int8 as ai

    q, k, v = (_r(1, 200, 2, d).transpose(1, 2) for _ in range(3))
    launches = recorded_launches(monkeypatch, lambda: ai._launcher(config)(q, k, v, False, None))
    assert [kernel.__name__ for kernel, _, _ in launches] == (
        ["_quantize_keys_kernel"] + ["_quantize_values_kernel"] * config.fp8_values + ["_attention_kernel"])
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert compiled.metadata.shared <= 227 * 1024, (kernel.__name__, compiled.metadata.shared)
        assert_waits_before_memory(kernel, compiled)
    sass = machine_code(compiled)
    products = set(re.findall(r"\b([IHQ]GMMA)\.", sass))
    assert products == {"IGMMA", "QGMMA" if config.fp8_values else "HGMMA"}, products
    assert ("UTMALDG" in sass) == config.tma


@pytest.mark.parametrize("k", [1536, 2240, 3072, 8960, 12288, 15360])
def test_fp8_row_quantization_compiles_for_every_dit_width(monkeypatch, k):
    """The activation's rows are held whole, as two power-of-two tiles (up to 16384 values on 16
    warps): each DiT width compiles."""
    from sgdiff.kernels.triton import linear_fp8

    x = _r(8, k)
    launches = recorded_launches(monkeypatch, lambda: linear_fp8.quantize_rows(x))
    assert len(launches) == 1
    compiled = compile_launch(*launches[0])
    assert compiled.metadata.num_warps == linear_fp8.rows_and_warps(k)[1]
    assert sum(linear_fp8.row_parts(k)) - k < k // 8  # few lanes past the row (8960: 8192 + 1024)
    assert_waits_before_memory(launches[0][0], compiled)


@pytest.mark.parametrize("dh,dx", [(0, 12288), (3072, 12288), (0, 8960), (0, 6144)])
def test_the_gelu_rows_pass_compiles_for_every_dit_width(monkeypatch, dh, dx):
    """gelu_linear_fp8's pass (the GELU of x, after a head read through its strides, held whole a
    row as 16-bit tiles) compiles for sm_90 on at most MAX_WARPS warps and waits for the kernel
    before it; its GELU is the fast form, one ex2 and one reciprocal a value, without tanhf's
    polynomial branch."""
    import struct

    from sgdiff.kernels.triton import gelu_linear_fp8 as glf
    from sgdiff.kernels.triton.cuda_math import TANH_P0

    x = _r(1, 8, dx)
    head = _r(1, 2, 8, dh // 2).transpose(1, 2).flatten(2, 3) if dh else None
    launches = recorded_launches(monkeypatch, lambda: glf.gelu_rows_fp8(x, head))
    assert [kernel.__name__ for kernel, _, _ in launches] == ["_gelu_rows_fp8_kernel"]
    compiled = compile_launch(*launches[0])
    assert compiled.metadata.num_warps == min(glf.MAX_WARPS, glf.linear_fp8.rows_and_warps(dh + dx)[1]) == 8
    assert_waits_before_memory(launches[0][0], compiled)
    ptx = compiled.asm["ptx"]
    ex2, rcp = ptx.count("ex2.approx"), ptx.count("rcp.approx")
    assert ex2 > 0 and ex2 == rcp, (ex2, rcp)
    assert "0f" + struct.pack(">f", TANH_P0.value).hex().upper() not in ptx  # tanhf's polynomial


@pytest.mark.parametrize("d", [64, 128])
def test_attention_fp8_operands_and_output_kernels_compile(monkeypatch, d):
    """q's, k's and v's statistics (each channel's range per tile, v's tile sums in token order,
    then per head), q, smoothed k and smoothed v to e4m3 (one scale, or per channel) and the output
    restored: each compiles for sm_90, waits for the kernel before it, and the copies convert to
    or from e4m3."""
    from sgdiff.kernels.triton import fp8_heads

    q, k, v = (_r(1, 200, 2, d).transpose(1, 2) for _ in range(3))
    launches = recorded_launches(monkeypatch, lambda: fp8_heads.quantize_operands(q, k, v))
    o8 = torch.zeros(1, 200, 2, d, dtype=torch.float8_e4m3fn)
    launches += recorded_launches(monkeypatch, lambda: fp8_heads.restore_heads(o8, torch.zeros(1, 2, 1, d),
                                                                               torch.ones(1, 2, d), torch.bfloat16))
    statistics = ["_ranges_kernel", "_finish_ranges_kernel"] * 2 + ["_ranges_sums_kernel", "_finish_ranges_kernel"]
    assert [kernel.__name__ for kernel, _, _ in launches] == (statistics + ["_quantize_heads_kernel"] * 3
                                                              + ["_restore_heads_kernel"])  # v's mean: its sums
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert_waits_before_memory(kernel, compiled)
        if kernel.__name__ not in statistics:
            assert "e4m3" in compiled.asm["ptx"], kernel.__name__
        if kernel.__name__ == "_ranges_sums_kernel":  # a token's loads and its addition, 64 of them, no tree
            assert compiled.asm["ptx"].count("add.f32") >= 63 and "bar.sync" not in compiled.asm["ptx"]


@pytest.mark.parametrize("gate_first", [True, False])
@pytest.mark.parametrize("config", GLU_CONFIGS, ids=lambda c: c.label)
def test_every_swiglu_configuration_compiles_within_an_h200s_shared_memory(monkeypatch, config, gate_first):
    """linear_glu's GEMM (two weight tiles a stage, two accumulators a tile) in each configuration
    first sight times: compiles for sm_90, fits in 227 KiB, multiplies on Hopper's bf16 ``wgmma``
    (HGMMA) and waits for the kernel before it. (The op's example compiles cuBLAS + silu_mul, its
    first candidate.)"""
    from sgdiff.kernels.triton import gemm

    x, w, b = _r(2, 200, 256), _r(2 * 384, 256), _r(2 * 384)
    glu = gemm.Epilogue(glu="gate_first" if gate_first else "gate_second")
    launches = recorded_launches(monkeypatch, lambda: gemm.launcher(config, x, w, b, None, glu)(x, w, b))
    (kernel, largs, kwargs), = launches
    compiled = compile_launch(kernel, largs, kwargs)
    assert compiled.metadata.shared <= 227 * 1024, compiled.metadata.shared
    assert_waits_before_memory(kernel, compiled)
    assert "HGMMA" in machine_code(compiled)


@pytest.mark.parametrize("op", ["linear_attention_scores", "linear_attention_apply"])
def test_linear_attention_dots_lower_to_fma_chains(monkeypatch, op):
    """Every variant first sight tries (the Triton kernel; with Gluon, the lanes or rows kernel in
    each tiling): its fp32 products (scores: ``tl.dot`` at IEEE precision or ``gl.fma``; apply:
    ``fma``) compile to fused multiply-adds (the order the ops' bits rest on), never to a
    tensor-core instruction, which would round the operands to tf32; each waits for the kernel
    before it. The Gluon kernels move no value between lanes (no shuffle): a thread's operands
    come from its registers and shared memory, an entry of an in-thread axis is a register (the
    select and the -0.0s of :func:`in_thread.take` fold away: no addition left a token)."""
    from sgdiff.kernels.triton import linear_attention_apply, linear_attention_scores

    module = linear_attention_scores if op == "linear_attention_scores" else linear_attention_apply
    impl = registry.op_def(op).triton_impl()
    for example in registry.op_def(op).examples:
        args = example.args(small=True)
        launches = recorded_launches(monkeypatch, lambda: [fn(*args) for _, fn in impl.variants(*args)])
        names = [kernel.__name__ for kernel, _, _ in launches]
        assert len(launches) == len(module.variants(*args)) and names[0] in ("_linear_attention_scores_kernel",
                                                                             "_linear_attention_apply_kernel")
        assert (len(set(names)) == 2) == (module.gluon is not None), names
        for kernel, largs, kwargs in launches:
            compiled = compile_launch(kernel, largs, kwargs)
            sass = machine_code(compiled)
            assert "FFMA" in sass and "fma.rn.f32" in compiled.asm["ptx"], kernel.__name__
            assert not re.search(r"\b(HMMA|HGMMA|IMMA|wgmma|mma\.sync)\b", sass + compiled.asm["ptx"]), kernel.__name__
            assert_waits_before_memory(kernel, compiled)
            if kernel.__name__.endswith(("_lanes_kernel", "_rows_kernel")):  # an entry of an in-thread axis is a
                assert "SHFL" not in sass, kernel.__name__  # register: no shuffle, and no addition (of -0.0) left
                assert len(re.findall(r"\bFADD\b", sass)) < 8, kernel.__name__  # (the normalizer's eps, the division's)
