"""Soak: the default call serving many calls at several resolutions, as a user's app does.

    python -m bench.soak [--calls 300] [--sides 6,8,10,12,14] [--size tiny] [--out bench/results]

One ``torch.compile(flux, backend="sgdiff")`` (no mode, no options, so CUDA graphs on) called
``--calls`` times cycling through the latent sides given (each a token count of its own), each
output checked ``torch.equal`` against the eager model's. Recorded: the compiles (Dynamo's
graphs, in all and after the first cycle through every side: the warm-up) and the GPU memory
allocated and reserved after each cycle, which must stay flat once every side has its graph.
Writes soak.json and soak.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json  # noqa: E402
from sgdiff.fxpasses.cudagraphs import WARMUP  # noqa: E402


def run(calls: int = 300, sides=(6, 8, 10, 12, 14), size: str = "tiny", device="cuda", dtype=torch.bfloat16) -> dict:
    from sgdiff import _compat, zoo

    torch._dynamo.reset()
    before = _compat.graphs_compiled()
    model, kwargs = zoo.build("flux", size, dtype=dtype, device=device)
    compiled = torch.compile(model, backend="sgdiff")
    cycles, unequal, warm_graphs = [], 0, None
    warm_cycles = WARMUP + 2  # per side: warm-up calls, a capture, a first replay
    with torch.no_grad():
        for i in range(calls):
            inputs = zoo.flux_inputs_at(kwargs, sides[i % len(sides)])
            if not torch.equal(compiled(**inputs)[0], model(**inputs)[0]):
                unequal += 1
            if (i + 1) % len(sides) == 0:
                if device == "cuda":
                    torch.cuda.synchronize()
                cycles.append(dict(calls=i + 1, graphs=_compat.graphs_compiled() - before,
                                   allocated_mib=torch.cuda.memory_allocated() / 2**20 if device == "cuda" else 0.0,
                                   reserved_mib=torch.cuda.memory_reserved() / 2**20 if device == "cuda" else 0.0))
                if len(cycles) == warm_cycles:
                    warm_graphs = cycles[-1]["graphs"]
    after = cycles[warm_cycles - 1:]
    return dict(model=f"flux ({size})", calls=calls, sides=list(sides), unequal=unequal,
                graphs=cycles[-1]["graphs"], graphs_after_warm_up=warm_graphs,
                recompiles_after_warm_up=cycles[-1]["graphs"] - (warm_graphs or 0),
                allocated_mib_range=[min(c["allocated_mib"] for c in after), max(c["allocated_mib"] for c in after)],
                reserved_mib_range=[min(c["reserved_mib"] for c in after), max(c["reserved_mib"] for c in after)],
                cycles=cycles)


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "soak")
    c = result["case"]
    lines = [f"# Soak: the default call, {c['calls']} calls cycling latent sides {c['sides']} ({result['gpu']})", "",
             f"{versions} {c['model']}, bf16, `torch.compile(model, backend=\"sgdiff\")` with no mode or options.", "",
             f"- outputs not torch.equal to eager's: {c['unequal']} of {c['calls']}",
             f"- Dynamo graphs compiled: {c['graphs']} in all, {c['recompiles_after_warm_up']} after the warm-up "
             f"(the first {(WARMUP + 2) * len(c['sides'])} calls)",
             f"- GPU memory after each cycle past the warm-up: allocated {c['allocated_mib_range'][0]:.1f}-"
             f"{c['allocated_mib_range'][1]:.1f} MiB, reserved {c['reserved_mib_range'][0]:.1f}-"
             f"{c['reserved_mib_range'][1]:.1f} MiB"]
    (out / "soak.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sides", default="6,8,10,12,14")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    case = run(args.calls, tuple(int(s) for s in args.sides.split(",")), args.size, args.device)
    meta = _meta()
    if args.device != "cuda":
        meta["gpu"] = "cpu"
    write_report(dict(meta, case=case), pathlib.Path(args.out))
    print({k: v for k, v in case.items() if k != "cycles"})
    flat = case["allocated_mib_range"][0] == case["allocated_mib_range"][1]
    return 0 if case["unequal"] == 0 and case["recompiles_after_warm_up"] == 0 and flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
