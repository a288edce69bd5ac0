"""pointwise_conv_act (``close``, extra-high) on the GPU: every implementation first sight keeps gives
its reference's bits (cuBLAS's linear over the tokens and ATen's activation), the op stays within
what moving cuDNN's rounding gives against eager's convolution, and at Sana's shape it is faster
than the lossless chain it replaces (cuDNN's convolution, then conv_silu's bias + SiLU pass)."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import dispatch, registry, tuning
from sgdiff.kernels.pointwise_conv_act import pointwise_conv_act_reference

pytestmark = pytest.mark.gpu
OP = registry.op_def("pointwise_conv_act").load()
CONV_SILU = registry.op_def("conv_silu").load()
ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


def _map(B, H, W, C, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, H * W, C, device="cuda", generator=g).to(dtype).unflatten(1, (H, W)).permute(0, 3, 1, 2)
    w = (torch.randn(N, C, 1, 1, device="cuda", generator=g) * C ** -0.5).to(dtype)
    return x, w, torch.randn(N, device="cuda", generator=g).to(dtype)


def _error(got, want):
    d = (got.float() - want.float()).abs()
    scale = want.float().abs().amax().item()
    return dict(max_abs=d.max().item(), max_rel_to_scale=d.max().item() / scale,
                share_differing=(d > 0).float().mean().item())


def _within_contract(got, want):
    """2 ulps of the output's scale: one rounding moved, the sums in another order."""
    e = _error(got, want)
    return e["max_rel_to_scale"] <= 2 * torch.finfo(want.dtype).eps, e


@settings(deadline=None, max_examples=8)
@given(B=st.integers(1, 2), H=st.integers(1, 40), W=st.integers(1, 40), C=st.sampled_from([64, 96, 1152, 2240]),
       N=st.sampled_from([64, 200, 2304, 11200]))
def test_the_op_is_its_reference_and_close_to_eager(B, H, W, C, N, act="silu", dtype=torch.bfloat16):
    """Shapes vary (one activation and dtype: sgdiff's GEMM compiles per epilogue; its others are
    tests/gpu/test_gemm_cute_gpu.py's)."""
    dispatch.reset()
    x, w, b = _map(B, H, W, C, N, dtype)
    got = OP(x, w, b, act)
    assert torch.equal(got, pointwise_conv_act_reference(x, w, b, act)) and not dispatch.disabled(), dispatch.disabled()
    want = ACTS[act](F.conv2d(x, w, b))
    assert got.stride() == want.stride()
    ok, err = _within_contract(got, want)
    assert ok, err


def test_sana_shape_is_faster_than_the_lossless_chain():
    """Sana 1.6B's conv_inverted + SiLU, 1024², batch 2: the op (first sight's choice) against
    conv_silu (lossless: cuDNN's convolution, then the bias + SiLU pass) and eager's chain."""
    dispatch.reset()
    x, w, b = _map(2, 32, 32, 2240, 11200, torch.bfloat16)
    got = OP(x, w, b, "silu")
    want = F.silu(F.conv2d(x, w, b))
    ok, err = _within_contract(got, want)
    chosen = {k[0]: v[0] for k, v in dispatch.tuned_choices().items()}
    geometry = [x, w, b, [1, 1], [0, 0], [1, 1], 1]
    _, (op_s, lossless_s, eager_s) = tuning.fastest(
        [lambda *a: OP(x, w, b, "silu"), lambda *a: CONV_SILU(*geometry), lambda *a: F.silu(F.conv2d(x, w, b))], ())
    record = dict(shape=[2, 2240, 32, 32], N=11200, chosen=chosen, op_us=op_s * 1e6, conv_silu_us=lossless_s * 1e6,
                  eager_us=eager_s * 1e6, error=err, gpu=torch.cuda.get_device_name())
    print("pointwise_conv_act at Sana's shape:", json.dumps(record))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "pointwise-conv-act-gpu.json"), "w") as f:
            json.dump(record, f, indent=1)
    assert ok, err
    assert op_s < lossless_s, record
