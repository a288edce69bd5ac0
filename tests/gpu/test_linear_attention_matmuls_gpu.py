"""linear_attention_apply and linear_attention_scores on CUDA: bitwise equal to eager's chains
(cuBLAS's fp32 bmm, the output's division and cast; the padded v and ReLU'd k widened), at
Sana's shapes and others, and through Sana's attention compiled."""
import pytest
import torch

from sgdiff.kernels import dispatch
from sgdiff.kernels.linear_attention_apply import linear_attention_apply_reference as ref
from sgdiff.kernels.linear_attention_out import linear_attention_out_reference
from sgdiff.kernels.linear_attention_scores import linear_attention_scores_reference as scores_ref
from sgdiff.kernels.triton import linear_attention_apply as tapply, linear_attention_scores as tscores
from tests.helpers import eager_and_compiled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def operands(B, H, D, N, dtype, seed=0):
    """Sana's: k ReLU'd, v padded with a row of ones, scores = v @ k in fp32; q the transposed view."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.relu(torch.randn(B * H, N, D, device="cuda", generator=g))
    v = torch.cat([torch.randn(B * H, D, N, device="cuda", generator=g), torch.ones(B * H, 1, N, device="cuda")], 1)
    q = (torch.randn(B, N, H * D, device="cuda", generator=g) * 2).to(dtype).transpose(1, 2).unflatten(1, (H, D))
    return torch.bmm(v, k), q


@pytest.mark.parametrize("shape", [(2, 70, 32, 1024), (1, 70, 32, 4096), (2, 2, 8, 7), (2, 16, 64, 333),
                                   (1, 3, 12, 130), (1, 4, 128, 200), (2, 3, 80, 65), (1, 5, 32, 31),
                                   (1, 2, 64, 300)])  # k in several dot steps
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bitexact_against_cublas(shape, dtype):
    scores, q = operands(*shape, dtype)
    args = (scores, q, 1e-15, dtype)
    assert tapply.can_use(*args)
    B, H, D, N = q.shape
    eager = linear_attention_out_reference(torch.matmul(scores.view(B, H, D + 1, D), torch.relu(q).float()), 1e-15,
                                           dtype)  # the processor's own spelling, all ATen
    for label, fn in tapply.variants(*args):  # the kernel, and with Gluon the rows kernel in each tiling
        got = fn(*args)
        assert got.stride() == eager.stride() and dispatch._first_difference(got, eager) is None, label
    assert len(tapply.variants(*args)) > 1 or tapply.gluon is None or D > tapply.ROWS_MAX_HEAD_DIM
    assert torch.equal(ref(*args), eager)  # the reference, through cast_copy and linear_attention_out


@pytest.mark.parametrize("shape", [(2, 70, 32, 1024), (1, 70, 32, 4096), (2, 2, 8, 7), (2, 16, 64, 333),
                                   (1, 3, 12, 130), (1, 8, 40, 257), (1, 4, 128, 300), (1, 5, 32, 31)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value", [1.0, -0.75])
def test_scores_bitexact_against_cublas(shape, dtype, value):
    B, H, D, N = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    v, k = ((torch.randn(B, N, H * D, device="cuda", generator=g) * 2).to(dtype).transpose(1, 2).unflatten(1, (H, D))
            for _ in range(2))
    k = k.transpose(2, 3)
    assert tscores.can_use(v, k, value)
    eager = torch.matmul(torch.nn.functional.pad(v.float(), (0, 0, 0, 1), value=value), torch.relu(k).float())
    for label, fn in tscores.variants(v, k, value):  # the kernel, and with Gluon the lanes kernel in each tiling
        assert dispatch._first_difference(fn(v, k), eager.view(B * H, D + 1, D)) is None, label
    assert torch.equal(scores_ref(v, k, value), eager.view(B * H, D + 1, D))


def test_sana_attention_compiled_is_equal():
    from diffusers.models.attention_processor import Attention, SanaLinearAttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=2240, heads=70, dim_head=32, bias=False,
                     processor=SanaLinearAttnProcessor2_0()).to("cuda", torch.bfloat16).eval()
    x = torch.randn(2, 1024, 2240, device="cuda", dtype=torch.bfloat16)
    want, got = eager_and_compiled(attn, x)
    assert torch.equal(got, want)
    assert not [k for k in dispatch.disabled() if k[0] in ("linear_attention_apply", "linear_attention_scores")]
    chosen = {op: (choice, times) for op, _, choice, times in dispatch.first_sight_report()
              if op.startswith("linear_attention_")}
    print("first sight:", chosen)  # which of the kernel and the former graph's ops each kept, in us
    assert set(chosen) == {"linear_attention_apply", "linear_attention_scores"}
