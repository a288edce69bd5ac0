"""Memory bench: the peak of a call, and what is alive at that peak, eager against sgdiff.

    python -m bench.memory [--cases vae_wan_480p_81f,wan22_ti2v] [--variants eager,sgdiff_no_cudagraphs]
                           [--min-mib 40] [--out bench/results/runs]

A case is one of bench.small_models' (a zoo DiT at ``blocks2``, or a VAE decode). Each variant
compiles anew (``torch._dynamo.reset()`` first: dynamo would otherwise serve an earlier
variant's compile) and is called twice; the third call is traced: the caching allocator's
history gives every allocation alive at the traced peak, with the Python frame it came from
(a line of a compiled graph's code resolved to its text). ``sgdiff_no_fold`` is the plain call
without :func:`sgdiff.fxpasses.addends.fold_addends`. CUDA graphs replay outside the allocator,
so variants with them report the allocator's peak only; compare without them. Writes
``memory-<commit>.json`` and prints the blocks of at least ``--min-mib``.
"""
from __future__ import annotations

import argparse
import gc
import pathlib
import sys
from typing import Dict, List, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json  # noqa: E402
from bench.small_models import VARIANTS, build  # noqa: E402

MIB = 2 ** 20
SPECS = dict(VARIANTS, sgdiff_no_fold=dict(backend="sgdiff", options={"cudagraphs": False}))


def peak_blocks(trace: List[dict]) -> tuple:
    """``(bytes, blocks)``: the most bytes the traced allocations held at once, and those blocks
    (each trace event's dict), in allocation order."""
    live: Dict[int, tuple] = {}
    total = best = 0
    best_live: Dict[int, tuple] = {}
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = (i, event)
            total += event["size"]
            if total > best:
                best, best_live = total, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[1]["size"]
    return best, [e for _, e in sorted(best_live.values(), key=lambda p: p[0])]


def origin(frames: List[dict], graphs: Dict[str, List[str]], depth: int = 3) -> str:
    """Where a block came from: the first frames in a compiled graph (its line's code), sgdiff
    or diffusers."""
    out = []
    for f in frames:
        name = f["filename"]
        if name in graphs:
            lines = graphs[name]
            text = lines[f["line"] - 1].strip() if 0 < f["line"] <= len(lines) else "?"
            out.append(f"graph {name.rsplit('.', 1)[-1]}:{f['line']}: {text[:140]}")
        elif "sgdiff" in name or "diffusers" in name:
            out.append(f"{name.rsplit('/', 1)[-1]}:{f['line']}:{f['name']}")
        if len(out) == depth:
            break
    return " <- ".join(out) or "?"


#: every graph sgdiff builds once :func:`record_graph_code` ran, by the file name its code runs under
GRAPHS: Dict[str, List[str]] = {}


def record_graph_code() -> None:
    """From now on, keep the code of each graph sgdiff builds in :data:`GRAPHS` (once a process)."""
    import sgdiff.backend as backend

    build_variant = backend.TieredGraph._build
    if getattr(build_variant, "records_code", False):
        return

    def recorded(self, tier, gm):
        fn = build_variant(self, tier, gm)
        GRAPHS[gm.forward.__code__.co_filename] = gm.code.splitlines()
        return fn

    recorded.records_code = True
    backend.TieredGraph._build = recorded


def run_case(case: str, variants, min_mib: float, dtype=torch.bfloat16) -> dict:
    from sgdiff import _compat
    from sgdiff.fxpasses import manager

    device = torch.device("cuda")
    record_graph_code()
    call, target = build(case, device, dtype)
    row: dict = {"model": case}
    want: Optional[torch.Tensor] = None
    fold = manager.fold_addends
    with torch.no_grad():
        for variant in variants:
            torch._dynamo.reset()
            manager.fold_addends = fold if variant != "sgdiff_no_fold" else (lambda gm: 0)
            spec = SPECS[variant]
            fn = target if spec is None else torch.compile(target, **spec)
            for _ in range(2):
                call(fn)
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with _compat.cuda_allocation_history() as trace:
                out = call(fn)
                torch.cuda.synchronize()
                events = trace()
            traced, blocks = peak_blocks(events)
            row[f"{variant}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)
            row[f"{variant}_traced_peak_gib"] = round(traced / 2 ** 30, 3)
            row[f"{variant}_blocks"] = [dict(mib=round(b["size"] / MIB, 1), origin=origin(b.get("frames", []), GRAPHS))
                                        for b in blocks if b["size"] >= min_mib * MIB]
            if want is None:
                want = out
            else:
                row[f"{variant}_equal"] = torch.equal(out, want)
            del out
    manager.fold_addends = fold
    torch._dynamo.reset()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="vae_wan_480p_81f")
    parser.add_argument("--variants", default="eager,sgdiff_no_cudagraphs")
    parser.add_argument("--min-mib", type=float, default=40)
    parser.add_argument("--out", default="bench/results/runs")
    args = parser.parse_args(argv)
    meta = _meta()
    cases = []
    for case in args.cases.split(","):
        row = run_case(case, args.variants.split(","), args.min_mib)
        cases.append(row)
        for variant in args.variants.split(","):
            print(f"== {case} {variant}: peak {row[f'{variant}_peak_gib']} GiB (traced {row[f'{variant}_traced_peak_gib']})"
                  + (f", equal {row[f'{variant}_equal']}" if f"{variant}_equal" in row else ""), flush=True)
            for b in row[f"{variant}_blocks"]:
                print(f"   {b['mib']:8.1f} MiB  {b['origin']}")
        _write_json(dict(meta, cases=cases), pathlib.Path(args.out), f"memory-{meta['commit'][:7]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
