"""Direct launches (LeanKernel) on CUDA: the same bits as Triton's own launch, a compile per
specialization, and less host time."""
import time

import pytest
import torch

from sgdiff.kernels.residual_gate import residual_gate_reference
from sgdiff.kernels.triton import residual_gate as trg

pytestmark = pytest.mark.gpu


def _inputs(offset):
    base = torch.randn(2 * 1024 * 2240 + offset, device="cuda", dtype=torch.bfloat16)
    residual = base[offset:].view(2, 1024, 2240)
    gate = torch.randn(2, 6, 2240, device="cuda", dtype=torch.bfloat16)[:, 2:3]
    update = torch.randn(2, 1024, 2240, device="cuda", dtype=torch.bfloat16)
    return residual, gate, update, False, True


def test_direct_launch_matches_tritons_own_at_every_alignment():
    kernel = trg._residual_gate_kernel
    assert kernel._direct
    for offset in (0, 1, 8):
        args = _inputs(offset)
        want = residual_gate_reference(*args)
        direct = trg.residual_gate(*args)
        kernel._direct = False
        try:
            own = trg.residual_gate(*args)
        finally:
            kernel._direct = True
        assert torch.equal(direct, want) and torch.equal(own, want)
    assert len({key[2][1] for key in kernel._launches}) == 2  # aligned and misaligned residuals


def test_direct_launch_costs_less_host_time():
    kernel, args = trg._residual_gate_kernel, _inputs(0)

    def host_us(calls=500):
        trg.residual_gate(*args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            trg.residual_gate(*args)
        elapsed = time.perf_counter() - t0  # time to issue, before the GPU drains
        torch.cuda.synchronize()
        return elapsed * 1e6 / calls

    direct = min(host_us() for _ in range(3))
    kernel._direct = False
    try:
        own = min(host_us() for _ in range(3))
    finally:
        kernel._direct = True
    print(f"host time per launch: direct {direct:.1f} us, Triton's own {own:.1f} us")
    assert direct < own
