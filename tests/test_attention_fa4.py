"""FlashAttention-4's forward as extra-high's attention candidate (where ``flash-attn-4`` is
installed): compiled for sm_90a on the CPU with fake tensors (nothing runs); its speed and error
against cuDNN's are measured on the GPU."""
import pytest
import torch

from tests.cute_target import COMPILE_ONLY  # before CuTe DSL is imported

pytest.importorskip("flash_attn.cute.interface")


@pytest.mark.skipif(not COMPILE_ONLY, reason="fake tensors stand for a GPU's here")
def test_the_candidate_takes_the_operands_heads_views():
    """It is handed the operands' ``[B, S, H, D]`` views and its ``[B, S, H, D]`` output comes back
    as ``[B, H, S, D]``, heads last in memory (as eager's kernels write it), at Flux's head dim and
    at Sana's (112)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sgdiff.kernels import sdpa

    assert "fa4" in [label for label, _ in sdpa.CANDIDATES]
    with FakeTensorMode():
        for b, s, s_k, h, d in ((1, 4608, 4608, 24, 128), (2, 1024, 300, 20, 112)):
            q = torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
            k = torch.empty(b, s_k, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
            out = sdpa._fa4(q, k, k, False, None)
            assert tuple(out.shape) == (b, h, s, d) and out.transpose(1, 2).is_contiguous()
