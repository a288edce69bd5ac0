"""First sight's timing on CUDA: GPU time from CUDA-graph replays, so a candidate whose host work
outlasts the hold no longer loses to one slower on the GPU; a candidate that cannot be captured is
timed from plain launches and the stream stays usable."""
import time

import pytest
import torch

from sgdiff.kernels import tuning

pytestmark = pytest.mark.gpu


def _host_heavy(x):
    """Little GPU work (one add), then 3 ms of host work a call: five calls outlast the hold."""
    y = x + 1
    time.sleep(3e-3)
    return y


def _gpu_heavy(x):
    """No host work to speak of, tens of microseconds on the GPU (a 4096^3 bf16 matmul)."""
    return x @ x


def _not_capturable(x):
    y = x + 1
    torch.cuda.synchronize()  # refused inside a capture
    return y


def test_host_work_does_not_count_where_the_candidate_is_captured():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    assert tuning.graph_of(_host_heavy, (x,)) is not None
    times = tuning.best_times([_gpu_heavy, _host_heavy], (x,))
    # the matmul: 2 * 4096^3 flop, tens of µs; the add: a few µs on the GPU, 3 ms a call on the host
    assert times[1] < times[0] < 1e-3, times
    assert tuning.fastest([_gpu_heavy, _host_heavy], (x,))[0] == 1


def test_a_candidate_that_cannot_be_captured_is_timed_as_launched():
    x = torch.randn(1024, 1024, device="cuda")
    assert tuning.graph_of(_not_capturable, (x,)) is None
    times = tuning.best_times([_gpu_heavy, _not_capturable], (x,))
    assert all(0 < t < 1 for t in times), times
    assert torch.equal(_not_capturable(x), x + 1)  # the stream and the allocator still serve


def test_a_failed_capture_leaves_the_random_stream_where_it_was():
    """A capture that fails must not leave the CUDA generator marked as capturing: the user's
    next random draw (a model's init, a pipeline's noise) works and continues the stream."""
    x = torch.randn(64, device="cuda")
    torch.cuda.manual_seed(7)
    first, second = torch.rand(8, device="cuda"), torch.rand(8, device="cuda")
    torch.cuda.manual_seed(7)
    assert torch.equal(torch.rand(8, device="cuda"), first)
    assert tuning.graph_of(_not_capturable, (x,)) is None
    assert torch.equal(torch.rand(8, device="cuda"), second)
    torch.nn.Linear(16, 16, device="cuda")  # kaiming init draws on the generator
