"""Direct launches (LeanKernel) on CUDA: the same bits as Triton's own launch, a compile per
specialization, and less host time; on Hopper, programmatic dependent launches whose kernels
read what the kernel before them wrote."""
import time

import pytest
import torch

from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference
from sgdiff.kernels.residual_gate import residual_gate_reference
from sgdiff.kernels.triton import launch
from sgdiff.kernels.triton import layernorm_modulate as tlm
from sgdiff.kernels.triton import residual_gate as trg

pytestmark = pytest.mark.gpu


def _inputs(offset):
    base = torch.randn(2 * 1024 * 2240 + offset, device="cuda", dtype=torch.bfloat16)
    residual = base[offset:].view(2, 1024, 2240)
    gate = torch.randn(2, 6, 2240, device="cuda", dtype=torch.bfloat16)[:, 2:3]
    update = torch.randn(2, 1024, 2240, device="cuda", dtype=torch.bfloat16)
    return residual, gate, update, "plain", True


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


def test_a_call_site_runs_its_bound_launch_exactly_and_for_less_host_time():
    from sgdiff.kernels import dispatch

    dispatch.reset()
    site, launcher = dispatch.CallSite("residual_gate", ((0, None), (1, None), (2, None))), dispatch.runner("residual_gate")
    for offset in (0, 1, 8, 0, 1):  # each alignment settled once, then bound
        args = _inputs(offset)
        assert torch.equal(site(*args), residual_gate_reference(*args))
    assert len(site._settled) == 2 and all(backend == "triton" for backend, _ in site._settled.values())
    assert not dispatch.disabled()

    def host_us(fn, args, calls=500):
        fn(*args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed * 1e6 / calls

    args = _inputs(0)
    bound, general = min(host_us(site, args) for _ in range(3)), min(host_us(launcher, args) for _ in range(3))
    print(f"host time per call: call site {bound:.1f} us, op launcher {general:.1f} us")
    assert bound < general


def test_each_dependent_launch_reads_what_the_kernel_before_it_wrote():
    """Sana's block boundary ten times over, each kernel reading the output of the one launched
    just before it (a programmatic dependent launch: its programs may start while that kernel
    finishes): bitwise the eager chain's, in a stream and replayed from a CUDA graph."""
    assert launch.dependent_launches(torch.cuda.current_device()), "an H200 launches dependently"
    torch.manual_seed(0)
    x = torch.randn(2, 1024, 2240, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(2, 2240, device="cuda", dtype=torch.bfloat16)
    shift, scale, gate = (torch.randn(2, 3, 2240, device="cuda", dtype=torch.bfloat16) / 8).chunk(3, dim=1)

    def chain(x, norm, gated):
        for _ in range(10):
            x = gated(x, gate, norm(x, w, b, 1e-6, scale, shift), "plain")
        return x

    want = chain(x, layernorm_modulate_reference, residual_gate_reference)
    assert torch.equal(chain(x, tlm.layernorm_modulate, trg.residual_gate), want)
    graph, static_x = torch.cuda.CUDAGraph(), x.clone()
    with torch.cuda.graph(graph):
        out = chain(static_x, tlm.layernorm_modulate, trg.residual_gate)
    for _ in range(3):
        graph.replay()
        assert torch.equal(out, want)
    for kernel in (tlm._layernorm_modulate_warp_row_kernel, trg._residual_gate_kernel):
        assert any(("launch_pdl", True) in key for key in kernel._launches), kernel.__name__
