"""Multi-GPU bench: DiT steps under diffusers context parallelism, eager against sgdiff.

    python -m bench.multigpu [--models flux,wan] [--modes ulysses,ring] [--world 2] [--out bench/results]

One process per GPU (NCCL; gloo on the CPU, where diffusers' native attention runs Ulysses
only: ring merges partial results through a log-sum-exp it does not return). Per model and
mode, on every rank: the transformer with ``enable_parallelism(ContextParallelConfig(...))``,
its step in eager and compiled with ``backend="sgdiff"`` (lossless), each timed in the same
process (CUDA events, median of ``--repeats``, every step after a barrier), the sgdiff output
``torch.equal`` to eager's on every rank; then, on rank 0 alone, sgdiff's step without
parallelism (the one-GPU figure the parallel step is compared with). The environment's NCCL
settings are used as they are. Writes multigpu.json and multigpu.md: ``{gpu, torch, triton,
commit, world, cases: [{model, size, mode, eager_cp_ms, sgdiff_cp_ms, equal, sgdiff_one_ms,
speedup_vs_one}]}``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json  # noqa: E402
from bench.timing import call_ms  # noqa: E402

MODES = ("ulysses", "ring")


def _step_ms(fn, device: torch.device, repeats: int, together: bool = True) -> float:
    """Median ms of a step; ``together``: every rank starting it at once (a barrier before each)."""
    times = []
    for _ in range(repeats):
        if together:
            dist.barrier()
        times.append(call_ms(fn, device))
    return statistics.median(times)


def _build(name: str, size: str, device: torch.device, dtype):
    from sgdiff import zoo

    torch.manual_seed(0)  # every rank the same weights and inputs
    return zoo.build(name, size=size, dtype=dtype, device=device)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # diffusers puts rank r on accelerator r % count: without one, the CPU
        torch.accelerator.device_count = lambda: 1
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    from diffusers import ContextParallelConfig

    dtype = getattr(torch, args.dtype)
    rows = []
    try:
        for name in args.models.split(","):
            for mode in args.modes.split(","):
                config = ContextParallelConfig(**{f"{mode}_degree": world})
                model, kw = _build(name, args.size, device, dtype)
                model.enable_parallelism(config=config)
                with torch.no_grad():
                    want = model(**kw)[0]
                    compiled = torch.compile(model, backend="sgdiff")
                    outs = [compiled(**kw)[0] for _ in range(3)]  # past first sight
                    eager_ms = _step_ms(lambda: model(**kw), device, args.repeats)
                    sgdiff_ms = _step_ms(lambda: compiled(**kw), device, args.repeats)
                equal = torch.tensor([all(torch.equal(o, want) for o in outs)], dtype=torch.int32, device=device)
                dist.all_reduce(equal, op=dist.ReduceOp.MIN)
                rows.append(dict(model=name, size=args.size, mode=mode, eager_cp_ms=round(eager_ms, 3),
                                 sgdiff_cp_ms=round(sgdiff_ms, 3), equal=bool(equal.item())))
                del model, compiled, outs, want
                torch._dynamo.reset()
        if rank == 0:
            for name in args.models.split(","):
                model, kw = _build(name, args.size, device, dtype)
                with torch.no_grad():
                    compiled = torch.compile(model, backend="sgdiff")
                    for _ in range(3):
                        compiled(**kw)
                    one_ms = _step_ms(lambda: compiled(**kw), device, args.repeats, together=False)
                for row in rows:
                    if row["model"] == name:
                        row.update(sgdiff_one_ms=round(one_ms, 3), speedup_vs_one=round(one_ms / row["sgdiff_cp_ms"], 3))
                del model, compiled
                torch._dynamo.reset()
            (pathlib.Path(out) / "rows.json").write_text(json.dumps(rows))
        dist.barrier()  # the other ranks wait for rank 0's one-GPU figures
    finally:
        dist.destroy_process_group()


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "multigpu")
    lines = [f"# sgdiff under context parallelism ({result['world']} x {result['gpu']})",
             f"{versions} Median step time in ms; "
             "equal: sgdiff's output torch.equal to eager's on every rank; one GPU: sgdiff without parallelism.", "",
             "| model | mode | eager (CP) | sgdiff (CP) | / eager | equal | sgdiff, one GPU | speedup over one GPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in result["cases"]:
        one = c.get("sgdiff_one_ms")
        lines.append(f"| {c['model']} ({c['size']}) | {c['mode']} | {c['eager_cp_ms']:.2f} | {c['sgdiff_cp_ms']:.2f} | "
                     f"{c['sgdiff_cp_ms'] / c['eager_cp_ms']:.3f} | {c['equal']} | "
                     f"{'-' if one is None else f'{one:.2f}'} | {c.get('speedup_vs_one', '-')} |")
    (out / "multigpu.md").write_text("\n".join(lines) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="flux,wan")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--size", default="full")
    parser.add_argument("--world", type=int, default=torch.cuda.device_count() or 2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; valid: {', '.join(MODES)}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        parser.error(f"--world {args.world} needs as many GPUs; {torch.cuda.device_count()} here")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(args.world, _free_port(), args, str(out)), nprocs=args.world)
    cases = json.loads((out / "rows.json").read_text())
    (out / "rows.json").unlink()
    meta = _meta()
    if args.device != "cuda":
        meta["gpu"] = "cpu"
    write_report(dict(meta, world=args.world, cases=cases), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
