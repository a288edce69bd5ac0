"""diffusers DiTs on CUDA: sgdiff output is torch.equal to eager, with the Triton kernels used."""
import pytest
import torch

import sgdiff
from sgdiff import zoo
from sgdiff.kernels import dispatch

pytestmark = pytest.mark.gpu
pytest.importorskip("diffusers")


@pytest.mark.parametrize("name,size,modulate", [("flux", "tiny", 6), ("sana", "tiny", 3), ("pixart", "tiny", 3),
                                                 ("flux", "small", 13), ("wan", "tiny", {torch.bfloat16: 4})])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compiled_model_is_bitwise_equal(name, size, modulate, dtype):
    # Wan in bf16: its fp32 chains with their casts, and the FP32LayerNorm of its cross-attention
    dispatch.reset()
    model, kwargs = zoo.build(name, size, dtype=dtype, device="cuda")
    report = sgdiff.explain(model, **kwargs)
    assert report.counts["modulate"] == (modulate.get(dtype, 3) if isinstance(modulate, dict) else modulate)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="sgdiff")
    with torch.no_grad():
        want = model(**kwargs)[0]
        got = compiled(**kwargs)[0]
        again = compiled(**kwargs)[0]  # verified signatures now run the kernel without the check
    assert torch.equal(got, want) and torch.equal(again, want)
    assert not dispatch.disabled(), dispatch.disabled()
    assert any(key[0] == "layernorm_modulate" for key in dispatch._verified)
