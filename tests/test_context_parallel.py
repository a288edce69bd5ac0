"""sgdiff under diffusers context parallelism, on the CPU: two processes over gloo.

Each rank compiles the parallel transformer (``enable_parallelism(ContextParallelConfig(
ulysses_degree=2))``) with ``backend="sgdiff"``, whole and with ``compile_repeated_blocks``:
its output is ``torch.equal`` to the same parallel run in eager, in one graph, and each rank
rewrites the sites a single process rewrites. Ulysses only: ring attention merges partial
results through each block's log-sum-exp, which diffusers' native attention (the one that runs
on the CPU) does not return; ring runs where flash or cuDNN attention does (GPUs).
"""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("diffusers")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(name, size):
    from sgdiff import zoo

    torch.manual_seed(0)  # every rank the same weights and inputs
    return zoo.build(name, size=size, dtype=torch.float32)


def _rank(rank, port, name, size, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    # diffusers puts rank r on accelerator r % count: on a machine without one, the CPU
    torch.accelerator.device_count = lambda: 1
    try:
        from diffusers import ContextParallelConfig

        from tests.helpers import compiled_with_its_report

        config = ContextParallelConfig(ulysses_degree=WORLD)
        model, kw = _build(name, size)
        model.enable_parallelism(config=config)
        regional, _ = _build(name, size)
        regional.enable_parallelism(config=config)
        regional.compile_repeated_blocks(backend="sgdiff")
        with torch.no_grad():
            want = model(**kw)[0]
            whole, report = compiled_with_its_report(model, kw, reset=False)  # what explain would report of it
            blocks = regional(**kw)[0]
        torch.save(dict(whole=torch.equal(whole, want), blocks=torch.equal(blocks, want), counts=report.counts,
                        graphs=report.graphs), os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name,size", [("flux", "tiny"), ("wan", "tiny")])
def test_ulysses_ranks_rewrite_what_one_process_does_and_match_eager(tmp_path, name, size):
    import sgdiff

    model, kw = _build(name, size)
    with torch.no_grad():
        single = sgdiff.explain(model, **kw).counts
    assert sum(single.values()) > 0
    mp.spawn(_rank, args=(_free_port(), name, size, str(tmp_path)), nprocs=WORLD)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert got["whole"] and got["blocks"], (rank, got)
        assert got["counts"] == single, (rank, got["counts"], single)
        assert got["graphs"] == 1  # the collectives inside the graph: no break per collective


def test_the_multigpu_bench_runs(tmp_path):
    """bench/multigpu.py end to end on the CPU (gloo, two processes, Ulysses, Flux tiny): its
    table, with sgdiff's output equal to eager's on every rank."""
    import json

    from bench import multigpu

    assert multigpu.main(["--models", "flux", "--modes", "ulysses", "--size", "tiny", "--device", "cpu",
                          "--dtype", "float32", "--repeats", "1", "--world", "2", "--out", str(tmp_path)]) == 0
    (case,) = json.loads((tmp_path / "multigpu.json").read_text())["cases"]
    assert case["mode"] == "ulysses" and case["equal"] is True
    assert case["eager_cp_ms"] > 0 and case["sgdiff_cp_ms"] > 0 and case["sgdiff_one_ms"] > 0
    assert "| flux (tiny) | ulysses |" in (tmp_path / "multigpu.md").read_text()
