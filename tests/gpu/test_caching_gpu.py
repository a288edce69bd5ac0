"""tests/test_caching.py on the GPU, the kernels running: the first-block cache's decisions and
output under sgdiff equal eager's-with-cache."""
import pytest
import torch

from tests.test_caching import check_same_decisions

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_first_block_cache_makes_eagers_decisions_with_the_kernels(dtype, monkeypatch):
    check_same_decisions("cuda", dtype, monkeypatch)
