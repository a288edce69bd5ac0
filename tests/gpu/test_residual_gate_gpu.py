"""residual_gate on CUDA: the Triton kernel is bitwise equal to eager, or is not used."""
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch, registry
from sgdiff.kernels.triton import residual_gate as tk
from tests.helpers import every_16bit_value

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dispatch")]
OP = registry.op_def("residual_gate").load()


# Flux.1-dev, Sana 1.6B, PixArt-Sigma, Wan 2.1 1.3B / 14B (fp32 stream), SD3.5-large, and a row
# with a tail just past the size where a program takes 16 warps (residual_gate.LARGE)
@pytest.mark.parametrize("shape,stream,update", [
    ((1, 4608, 3072), torch.bfloat16, torch.bfloat16), ((2, 1024, 2240), torch.bfloat16, torch.bfloat16),
    ((2, 4096, 1152), torch.float16, torch.float16), ((1, 32760, 1536), torch.float32, torch.bfloat16),
    ((1, 32760, 5120), torch.float32, torch.bfloat16), ((1, 4429, 2432), torch.bfloat16, torch.bfloat16),
    ((1, 10923, 3073), torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("per_token", [False, True])
def test_real_shapes_bitexact(shape, stream, update, per_token):
    B, S, D = shape
    res = torch.randn(shape, device="cuda").to(stream)
    gate = (torch.randn(B, S, 2 * D, device="cuda") if per_token else
            torch.randn(B, 6 * D, device="cuda")).to(stream)
    gate = gate.chunk(2, dim=-1)[1] if per_token else gate.chunk(6, dim=1)[2][:, None]
    upd = torch.randn(shape, device="cuda").to(update)
    args = (res, gate, upd, "plain")
    assert tk.can_use(*args)
    assert torch.equal(tk.residual_gate(*args), res + gate * upd)
    # Sana's linear-attention output projection: bmm on a transposed input, then its bias
    bias = torch.randn(D, device="cuda").to(update)
    assert tk.can_use(*args, True, bias)
    assert torch.equal(tk.residual_gate(*args, True, bias), res + gate * (upd + bias))


@settings(max_examples=int(os.environ.get("SGDIFF_GPU_EXAMPLES", "40")), deadline=None)
@given(B=st.integers(1, 3), S=st.integers(1, 200), D=st.integers(1, 3000),
       dtypes=st.sampled_from([(torch.bfloat16,) * 3, (torch.float16,) * 3, (torch.float32,) * 3,
                               (torch.float32, torch.float32, torch.bfloat16)]),
       gate_form=st.sampled_from(["row", "per_token", "vector", "transposed_residual", "channels_first"]),
       gate_kind=st.sampled_from(["plain", "tanh", "sigmoid"]), bias=st.sampled_from([None, "same", "fp32"]),
       divisor=st.sampled_from([None, 1.0, 3.0, 0.7, 2]))
def test_any_layout_is_exact_or_falls_back(B, S, D, dtypes, gate_form, gate_kind, bias, divisor):
    rd, gd, ud = dtypes
    res = torch.randn(B, S, D, device="cuda").to(rd)
    if gate_form == "transposed_residual":
        res = res.transpose(0, 1).contiguous().transpose(0, 1)
    elif gate_form == "channels_first":  # Sana's token stream: [B, D, S] memory read as [B, S, D]
        res = res.transpose(1, 2).contiguous().transpose(1, 2)
    gate = {"row": lambda: torch.randn(B, 1, D, device="cuda"), "per_token": lambda: torch.randn(B, S, D, device="cuda"),
            "vector": lambda: torch.randn(D, device="cuda"), "channels_first": lambda: torch.randn(B, 1, D, device="cuda"),
            "transposed_residual": lambda: torch.randn(B, 1, D, device="cuda")}[gate_form]().to(gd)
    upd = torch.randn(B, S, D, device="cuda").to(ud)
    b = None if bias is None else torch.randn(D, device="cuda").to(ud if bias == "same" else torch.float32)
    u = upd if b is None else upd + b
    g = {"plain": gate, "tanh": torch.tanh(gate), "sigmoid": torch.sigmoid(gate)}[gate_kind]
    want = res + g * (u if divisor is None else u / divisor)
    got = OP(res, gate, upd, gate_kind, True, b, divisor)
    assert torch.equal(got, want) and got.stride() == want.stride()
    assert not dispatch.disabled(), dispatch.disabled()


@settings(max_examples=int(os.environ.get("SGDIFF_GPU_EXAMPLES", "40")), deadline=None)
@given(B=st.integers(1, 3), S=st.integers(1, 200), D=st.sampled_from([16, 1536, 2240, 3000, 5120]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), per_token=st.booleans(),
       gate_dtype=st.sampled_from([torch.float32, "narrow"]))
def test_wan_casts_are_exact(B, S, D, dtype, per_token, gate_dtype):
    """Wan: (x.float() + y.float() * gate).type_as(x) read and written narrow: the op takes the
    bf16/fp16 stream and update, widens them in registers and writes the cast sum."""
    gate_dtype = dtype if gate_dtype == "narrow" else gate_dtype
    x, y = (torch.randn(B, S, D, device="cuda").to(dtype) for _ in range(2))
    gate = torch.randn(B, S if per_token else 1, D, device="cuda").to(gate_dtype)
    want = (x.float() + y.float() * gate).type_as(x)
    # a narrow gate times a narrow update would round to bf16: the update's cast then stays
    update = y if gate_dtype == torch.float32 else y.float()
    got = OP(x, gate, update, "plain", True, None, None, dtype)
    assert got.dtype == dtype and torch.equal(got, want)
    assert not dispatch.disabled(), dispatch.disabled()


ADD = registry.op_def("residual_add").load()


@pytest.mark.parametrize("update_alike", [False, True])
def test_sanas_channels_first_stream_takes_the_kernel(update_alike):
    """Sana 1.6B's token stream after its Mix-FFN, [B, C, S] memory read as [B, S, C]: the kernel
    runs over it in its memory order (no eager chain), eager's bits in eager's strides."""
    B, S, C = 2, 1024, 2240
    res = torch.randn(B, C, S, device="cuda").to(torch.bfloat16).transpose(1, 2)
    upd = torch.randn(B, C, S, device="cuda").to(torch.bfloat16)
    upd = upd.transpose(1, 2) if update_alike else upd.transpose(1, 2).contiguous()
    gate = torch.randn(B, 6 * C, device="cuda").to(torch.bfloat16).chunk(6, dim=1)[2][:, None]
    assert tk.can_use(res, gate, upd, "plain")
    got, want = tk.residual_gate(res, gate, upd, "plain"), res + gate * upd
    assert torch.equal(got, want) and got.stride() == want.stride() == res.stride()
    if update_alike:
        assert tk.residual_add_can_use(res, upd, 2.0, True)
        got, want = tk.residual_add(res, upd, 2.0, True), upd / 2.0 + res
        assert torch.equal(got, want) and got.stride() == want.stride()


@settings(max_examples=int(os.environ.get("SGDIFF_GPU_EXAMPLES", "40")), deadline=None)
@given(B=st.integers(1, 3), S=st.integers(1, 300), D=st.sampled_from([16, 1152, 2240, 3072]),
       dtypes=st.sampled_from([(torch.bfloat16,) * 2, (torch.float16,) * 2, (torch.float32,) * 2,
                               (torch.float32, torch.bfloat16)]),
       divisor=st.sampled_from([1.0, 3.0, 0.7, 8, 1e-3]), update_first=st.booleans(),
       layout=st.sampled_from(["contiguous", "transposed_residual", "transposed_update", "channels_first"]))
def test_rescaled_residual_is_exact_or_falls_back(B, S, D, dtypes, divisor, update_first, layout):
    """Sana's and PixArt's cross-attention: attn / rescale_output_factor + x, as eager computes it
    (a product with the divisor's fp32 reciprocal), in eager's layout."""
    res = torch.randn(B, S, D, device="cuda").to(dtypes[0])
    upd = (torch.randn(B, S, D, device="cuda") * 4).to(dtypes[1])
    if layout == "transposed_residual":
        res = res.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "transposed_update":
        upd = upd.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "channels_first":  # both laid out as Sana's token stream
        res, upd = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (res, upd))
    want = upd / divisor + res if update_first else res + upd / divisor
    got = ADD(res, upd, divisor, update_first)
    assert torch.equal(got, want) and got.stride() == want.stride()
    assert not dispatch.disabled(), dispatch.disabled()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("divisor", [1e-3, 1.1, 0.7, 3.0, 2.3e-5, 1.0, 1.00000001])
def test_every_value_divided_as_eager_divides(dtype, divisor):
    """Every finite fp16/bf16 update over a CPU-scalar divisor: 1e-3 and 1.1 are where an fp32
    reciprocal taken in fp32 misses eager's by an ulp (and with it ties of the product)."""
    values = every_16bit_value(dtype)
    upd = values[values.isfinite()].view(1, -1, 64)
    res = torch.zeros_like(upd)  # 0 + y is y: the quotient's rounding alone is compared
    assert torch.equal(tk.residual_add(res, upd, divisor, False), res + upd / divisor)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [0.7, 1.0, 1e-3, 1 / 3, 3, 1.00000001, 65504.5])
def test_every_value_scaled_as_eager_scales(dtype, scale):
    """Every finite fp16/bf16 update (and fp32 ones) times a Python number (ConsisID's face
    scale): the number rounded to fp32, the product rounded once, as ATen's mul by a CPU scalar."""
    values = every_16bit_value(dtype) if dtype != torch.float32 else torch.randn(1 << 16, device="cuda") * 1e4
    upd = values[values.isfinite()]
    upd = upd[: upd.numel() // 64 * 64].view(1, -1, 64)
    res = torch.zeros_like(upd)
    for want in (res + scale * upd, scale * upd + res):
        assert torch.equal(tk.residual_add(res, upd, None, False, scale), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
def test_a_divisor_of_one_keeps_every_value(dtype, gated):
    """A divisor whose reciprocal is 1 skips the product (scales): every fp16/bf16 update,
    infinities and NaNs included, gives eager's bits, a NaN where eager's is."""
    values = every_16bit_value(dtype)
    upd = values.view(1, -1, 64)
    res = torch.randn(upd.shape, device="cuda").to(dtype)
    gate = torch.randn(1, 1, 64, device="cuda").to(dtype)
    if gated:
        got, want = tk.residual_gate(res, gate, upd, "plain", True, None, 1.0), res + gate * (upd / 1.0)
    else:
        got, want = tk.residual_add(res, upd, 1.0, False), res + upd / 1.0
    numbers = ~want.isnan()
    assert torch.equal(got.isnan(), ~numbers)
    assert torch.equal(got.view(torch.int16)[numbers], want.view(torch.int16)[numbers])  # signed zeros too


def test_tanh_gates_match_cuda_tanhf():
    """Lumina-style tanh gates: every bf16 value and fp32 extremes (denormals, inf, NaN)."""
    every_bf16 = every_16bit_value(torch.bfloat16)
    extremes = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-38, 9.0, -9.0, 20.0, float("inf"), -float("inf"),
                             float("nan"), 0.6, -0.6, 0.59999996, 1e-4, -3e-3], device="cuda")
    for values in (every_bf16, extremes, torch.randn(1 << 20, device="cuda") * 3):
        gate = values.view(1, -1, 16)  # per-token gates
        res, upd = torch.zeros_like(gate), torch.ones_like(gate)  # out = tanh(gate), rounded
        assert tk.can_use(res, gate, upd, "tanh")
        got, want = tk.residual_gate(res, gate, upd, "tanh"), res + torch.tanh(gate) * upd
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
