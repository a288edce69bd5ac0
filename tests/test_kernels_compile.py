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
from sgdiff.kernels.triton.launch import LeanKernel  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
pytestmark = [pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton bundles no ptxas"),
              pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET=1: kernels are interpreted, not compiled")]

POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
           torch.int64: "*i64", torch.uint8: "*u8", torch.bool: "*i1"}


def recorded_launches(monkeypatch, call):
    """``[(kernel, args, kwargs)]``: the LeanKernel launches ``call()`` makes, none of them run."""
    launches = []

    def launcher(kernel, kwargs):
        return lambda *args, **more: launches.append((kernel, args, {**kwargs, **more}))

    monkeypatch.setattr(LeanKernel, "bound", lambda self, grid, **kwargs: launcher(self, kwargs))
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


def assert_waits_before_memory(kernel: LeanKernel, compiled):
    """The kernel's first global load or store comes after ``griddepcontrol.wait`` (ACQBULK)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    first = GLOBAL_MEMORY.search(sass)
    assert first, f"{kernel.__name__}: no global load or store"
    wait = sass.find("ACQBULK")
    assert 0 <= wait < first.start(), f"{kernel.__name__}: {first.group(1)} before the grid dependency wait"


def _r(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def _chunks(B, D, n, dtype=torch.bfloat16):
    """n [B, 1, D] chunk views of one [B, n D] projection, as adaLN's emb.chunk(n, dim=1)."""
    return [c[:, None] for c in _r(B, n * D, dtype=dtype).chunk(n, dim=1)]


def _table_rows(B, D, n):
    """LTX-Video's (table[None, None] + temb.reshape(B, 1, n, D)).unbind(dim=2): strided rows."""
    return list((_r(n, D)[None, None] + _r(B, 1, n * D).reshape(B, 1, n, D)).unbind(dim=2))


def _freqs(S, half):
    return torch.polar(torch.rand(S, half) + 0.5, torch.randn(S, half))


def _cases():
    """One param per (op, form), ``(op, make)`` with ``make()`` the op's arguments: the forms the
    model tests and the bench meet, in bf16 unless named."""
    S, H = 64, 3
    cos, sin = _r(S, 128, dtype=torch.float32), _r(S, 128, dtype=torch.float32)
    c = [
        ("layernorm_modulate", "Sana affine-free", lambda: (_r(2, S, 2240), None, None, 1e-6, *_chunks(2, 2240, 2), True)),
        ("layernorm_modulate", "PixArt table rows", lambda: (_r(2, S, 1152), None, None, 1e-6, *_table_rows(2, 1152, 2), True)),
        ("layernorm_modulate", "Flux affine fp32 params",
         lambda: (_r(1, S, 3072), _r(3072), _r(3072), 1e-6, *_chunks(1, 3072, 2, torch.float32), True)),
        ("layer_norm", "per head, affine", lambda: (_r(1, S, H, 128), _r(128), _r(128), 1e-6)),
        ("layer_norm", "Wan FP32LayerNorm",
         lambda: (_r(1, S, 1536), _r(1536, dtype=torch.float32), _r(1536, dtype=torch.float32), 1e-6,
                  torch.float32, torch.bfloat16)),
        ("modulate", "chunks", lambda: (_r(2, S, 3072), *_chunks(2, 3072, 2))),
        ("modulate", "per token", lambda: (_r(2, S, 1152), _r(2, S, 1152), _r(2, S, 1152))),
        ("residual_gate", "broadcast gate", lambda: (_r(2, S, 3072), _chunks(2, 3072, 3)[2], _r(2, S, 3072), False)),
        ("residual_gate", "tanh gate", lambda: (_r(2, S, 2304), _r(2, 1, 2304), _r(2, S, 2304), True)),
        ("residual_add", "divisor", lambda: (_r(2, S, 2240), _r(2, S, 2240), 2.0, False)),
        ("rms_norm", "diffusers per head", lambda: (_r(1, S, H, 128), _r(128), 1e-6, "diffusers")),
        ("rms_norm", "diffusers rows of 64 (SD3.5)", lambda: (_r(2, H, S, 64), _r(64), 1e-6, "diffusers")),
        ("rms_norm", "diffusers rows of 2304, fp32 weight",
         lambda: (_r(2, S, 2304), _r(2304, dtype=torch.float32), 1e-5, "diffusers")),
        ("rms_norm", "fused per head", lambda: (_r(1, S, H, 128), _r(128), 1e-6, "fused")),
        ("rms_norm", "fused across heads", lambda: (_r(1, S, 5120), _r(5120), 1e-6, "fused")),
        ("rmsnorm_modulate", "diffusers LTX", lambda: (_r(2, S, 2048), None, 1e-6, "diffusers", *_table_rows(2, 2048, 2)[::-1])),
        ("rmsnorm_modulate", "diffusers Lumina", lambda: (_r(2, S, 2304), _r(2304), 1e-5, "diffusers", _chunks(2, 2304, 4)[0], None)),
        ("rmsnorm_modulate", "diffusers per head, per token",
         lambda: (_r(1, S, H, 128), _r(128), 1e-6, "diffusers", _r(1, S, H, 128), _r(1, S, H, 128))),
        ("rmsnorm_modulate", "fused, chunks", lambda: (_r(2, S, 3072), _r(3072), 1e-6, "fused", *_chunks(2, 3072, 2))),
        ("rmsnorm_modulate", "fused, fp32 scale",
         lambda: (_r(2, S, 1536), None, 1e-6, "fused", _r(2, 1, 1536, dtype=torch.float32), _r(2, 1, 1536))),
        ("rope", "interleaved", lambda: (_r(1, S, H, 128), cos[None, :, None], sin[None, :, None], True)),
        ("rope", "rotate-half, heads first", lambda: (_r(1, H, S, 128), cos[None, None], sin[None, None], False)),
        ("rope_even_odd", "Wan fp32 tables", lambda: (_r(1, S, H, 128), cos[None, :, None, :64], sin[None, :, None, :64])),
        ("rope_complex", "Qwen-Image", lambda: (_r(1, S, H, 128), _freqs(S, 64)[:, None])),
        ("rms_norm_rope", "Flux q", lambda: (_r(1, S, H, 128), _r(128), 1e-6, "fused", cos[None, :, None],
                                             sin[None, :, None], True)),
        ("rms_norm_cat_rope", "Flux text + image", lambda: (_r(1, 16, H, 128), _r(128), _r(1, S - 16, H, 128), _r(128),
                                                            1e-6, "fused", cos[None, :, None], sin[None, :, None], True)),
        ("silu_mul", "SwiGLU halves", lambda: (*_r(2, S, 2 * 4096).chunk(2, dim=-1),)),
        ("gelu_tanh_cat", "Sana's GELU of a projection and a cat", lambda: (_r(2 * S, 3072), _r(2 * S, 768))),
        ("cast_copy", "q to fp32, contiguous", lambda: (_r(1, H, S, 128).transpose(1, 2), torch.float32, False,
                                                        [0, 0, 0, 0], 0.0, True)),
        ("linear_attention_out", "Sana linear attention", lambda: (_r(2, 70, 33, S, dtype=torch.float32), 1e-15,
                                                                    torch.bfloat16)),
    ]
    return [pytest.param(op, make, id=f"{op}: {label}") for op, label, make in c]


def test_cases_cover_every_triton_op():
    ops = {o.name for o in registry.ops() if any(s.backend == "triton" for s in registry.kernel_specs(o.name))}
    covered = {p.values[0] for p in _cases()}
    assert ops - covered <= {"conv_silu", "conv_silu_mul"}, ops - covered  # epilogues: their own cases below


@pytest.mark.parametrize("op,make", _cases())
def test_launch_compiles_for_sm90(monkeypatch, op, make):
    fn = next(s for s in registry.kernel_specs(op) if s.backend == "triton").load()
    torch.manual_seed(0)
    args = make()
    launches = recorded_launches(monkeypatch, lambda: fn(*args))
    assert launches, f"{op} launched no Triton kernel"
    for kernel, largs, kwargs in launches:
        compiled = compile_launch(kernel, largs, kwargs)
        assert compiled.asm["cubin"], kernel.__name__
        assert_waits_before_memory(kernel, compiled)


@pytest.mark.parametrize("halves", [False, True])
def test_conv_epilogue_compiles_for_sm90(monkeypatch, halves):
    from sgdiff.kernels.triton import silu_mul as sm
    y, bias = _r(2, 2 * 64 if halves else 64, 16, 16).to(memory_format=torch.channels_last), _r(2 * 64 if halves else 64)
    bind = sm.bias_silu_mul_bind if halves else sm.bias_silu_bind
    launches = recorded_launches(monkeypatch, lambda: bind(y, bias)(y, bias))
    assert launches
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
    launches = recorded_launches(monkeypatch, lambda: trg.residual_gate(x, gate, x, False))
    (kernel, largs, kwargs), = launches
    compiled = compile_launch(kernel, largs, kwargs, arch=80)
    assert "griddepcontrol" not in compiled.asm["ptx"]
    monkeypatch.setattr(target_info, "current_target", _target(90))
    assert "griddepcontrol.wait" in compile_launch(kernel, largs, kwargs).asm["ptx"]  # on sm_90 it waits
