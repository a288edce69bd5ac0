"""pointwise_conv_act (``close``, extra-high) on the GPU: first sight keeps eager's convolution path
or the GEMM over the map's tokens, whichever is faster; the op gives that path's bits (eager's, or
its reference's: cuBLAS's linear over the tokens and ATen's activation), within what moving
cuDNN's rounding gives against eager's convolution, in eager's layout."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sgdiff.kernels import conv_as_gemm, dispatch, registry, tuning
from sgdiff.kernels.layout import same_strides
from sgdiff.kernels.pointwise_conv_act import pointwise_conv_act_reference

pytestmark = pytest.mark.gpu
OP = registry.op_def("pointwise_conv_act").load()


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


def _check(x, w, b, act="silu"):
    """The op's output: the chosen path's bits, eager's layout, within the contract; the path."""
    got = OP(x, w, b, act)
    path = conv_as_gemm.choose(x, w, b, act)[0]
    want = F.silu(F.conv2d(x, w, b))
    exact = want if path == "convolution" else pointwise_conv_act_reference(x, w, b, act)
    assert torch.equal(got, exact) and not dispatch.disabled(), (path, dispatch.disabled())
    assert same_strides(got.shape, got.stride(), want.stride()), (got.stride(), want.stride())
    err = _error(got, want)
    assert err["max_rel_to_scale"] <= 2 * torch.finfo(want.dtype).eps, err  # 2 ulps of the output's scale
    return path, err


@settings(deadline=None, max_examples=8)
@given(B=st.integers(1, 2), H=st.integers(1, 40), W=st.integers(1, 40), C=st.sampled_from([64, 96, 1152, 2240]),
       N=st.sampled_from([64, 200, 2304, 11200]))
def test_the_op_is_a_paths_bits_and_close_to_eager(B, H, W, C, N):
    """Shapes vary (SiLU and bf16: sgdiff's GEMM compiles per epilogue; its others are
    tests/gpu/test_gemm_cute_gpu.py's)."""
    dispatch.reset()
    _check(*_map(B, H, W, C, N, torch.bfloat16))


def test_sana_shape_takes_the_faster_path():
    """Sana 1.6B's conv_inverted + SiLU, 1024², batch 2: first sight's path is the faster of eager's
    convolution path (cuDNN's convolution, then conv_silu's bias + SiLU pass) and the GEMM."""
    dispatch.reset()
    x, w, b = _map(2, 32, 32, 2240, 11200, torch.bfloat16)
    path, err = _check(x, w, b)
    paths = dict(conv_as_gemm.CANDIDATES)
    _, (conv_s, gemm_s, eager_s) = tuning.fastest(  # the tensors as arguments: GPU time
        [lambda x, w, b: paths["convolution"](x, w, b, "silu"), lambda x, w, b: paths["gemm"](x, w, b, "silu"),
         lambda x, w, b: F.silu(F.conv2d(x, w, b))], (x, w, b))
    record = dict(shape=[2, 2240, 32, 32], N=11200, path=path, gemm_choice=dict(
        (k[0], v[0]) for k, v in dispatch.tuned_choices().items()), convolution_us=conv_s * 1e6, gemm_us=gemm_s * 1e6,
        eager_us=eager_s * 1e6, error=err, gpu=torch.cuda.get_device_name())
    print("pointwise_conv_act at Sana's shape:", json.dumps(record))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "pointwise-conv-act-gpu.json"), "w") as f:
            json.dump(record, f, indent=1)
    assert path == ("gemm" if gemm_s * (1 + tuning.MARGIN) < conv_s else "convolution") or \
        abs(gemm_s - conv_s) < 0.05 * conv_s, record  # a choice within the timing's noise either way
