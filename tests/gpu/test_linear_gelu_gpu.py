"""linear_gelu_tanh (``close``, extra-high) on cuBLASLt: chosen over the fp32 reference and
within the op's contract at real feed-forward shapes."""
import pytest
import torch
import torch.nn.functional as F

from sgdiff.kernels import dispatch, registry
from tests.helpers import LINEAR_GELU_SHARE, assert_linear_gelu_contract

pytestmark = pytest.mark.gpu
OP = registry.op_def("linear_gelu_tanh").load()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,K,N", [(4608, 3072, 12288),  # Flux.1-dev's feed-forward
                                   (32760, 1536, 8960),  # Wan 2.1 1.3B's
                                   (333, 96, 384)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gelu_runs_on_cublaslt_within_its_contract(dtype, M, K, N, bias):
    dispatch.reset()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, M, K, device="cuda", generator=g).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=g).to(dtype) if bias else None
    got = OP(x, w, b)
    assert_linear_gelu_contract(got, F.gelu(F.linear(x, w, b), approximate="tanh"), LINEAR_GELU_SHARE[dtype])
    assert [spec.backend for (op, *_), (spec, *_) in dispatch._chosen.items() if op == "linear_gelu_tanh"] == ["cublaslt"]
