"""Rivals bench: sgdiff's default call against Inductor's, in one process, their steps alternating.

    python -m bench.rivals [--models flux,sana,wan] [--size full] [--rounds 6] [--repeats 5]
                           [--ours sgdiff_default,sgdiff_cudagraph_gemm] [--rivals eager,inductor,...]

bench/models.py times each variant in a process of its own; a ratio of two such figures carries
the two processes' difference in GPU clocks and host speed (on one H100, lossless sgdiff's Sana
step read 15.30 ms against Inductor reduce-overhead's 15.18 in two processes, and 14.70 against
15.52 in one). Here the model is built once; eager, ``torch.compile`` default (Inductor), with
``mode="reduce-overhead"`` (Inductor's CUDA graphs) and ``backend="sgdiff"`` (no option:
lossless, CUDA graphs) are compiled and warmed; then ``--rounds`` rounds each time ``--repeats``
steps of every variant in turn, the order reversed every other round (a drift of the clocks
weighs on all alike). A step is timed two ways (bench/models.py's ``step_times``): synchronized
(``ms``: from an idle GPU to the step's last kernel) and pipelined (calls issued back to back, as
a denoising loop issues them). Each round gives sgdiff's ratio to each rival; the report gives
the median ratio over the rounds and its range, and each variant's median step. sgdiff's output
must be ``torch.equal`` to eager's. ``--ours`` names the sgdiff variants (bench/models.py's
names; by default the plain call), each timed and compared the same way; ``--rivals`` the variants
they are compared with (by default eager and both Inductors; any of bench/models.py's, such as
``sgdiff_cudagraph_nogemm`` for an A/B of the gemm family without Inductor's compile time). Writes rivals.json and
rivals.md: ``{gpu, torch, triton, commit, cases: [{model, size, steps: {variant: {ms,
pipelined_ms, host_ms}}, ratios: {ours: {rival: {ms: [median, low, high], pipelined_ms: [...]}}},
inductor_best, equal: {ours: bool}, first_sight: {ours: [{op, shapes, chosen, us}]}, commit?}]}``:
first_sight, what each sgdiff variant's first calls chose at the signatures of tuned ops it met
first (a GEMM's implementation and tile, each candidate's µs); a case's own ``commit`` where it was
measured on another tree than the file's (cases of several runs gathered in one file).
"""
from __future__ import annotations

import argparse
import collections
import gc
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _write_json  # noqa: E402
from bench.models import VARIANTS, step_times  # noqa: E402
from bench.tiers import each_model  # noqa: E402
from sgdiff.kernels import dispatch  # noqa: E402

INDUCTOR = ("inductor", "inductor_reduce_overhead")
RIVALS = ("eager", *INDUCTOR)
OURS = ("sgdiff_default",)
KEYS = ("ms", "pipelined_ms")


def run_model(name: str, size: str, device: torch.device, dtype, rounds: int, repeats: int, ours=OURS,
              rivals=RIVALS) -> list:
    from sgdiff import zoo

    model, kwargs = zoo.build(name, size, dtype=dtype, device=device)
    with torch.no_grad():
        want = model(**kwargs)[0].clone()
        fns, equal, first_sight = {}, {}, {}
        for variant in (*rivals, *ours):  # main() keeps the two apart
            spec = VARIANTS[variant]
            fns[variant] = model if spec is None else torch.compile(model, **spec)
            before = set(dispatch.tuned_choices())
            t0 = time.perf_counter()
            outs = [fns[variant](**kwargs)[0].clone() for _ in range(4)]  # past warm-up and capture
            print(f"bench.rivals: {name} {variant} compiled and warm in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
            if variant in ours:
                equal[variant] = all(torch.equal(o, want) for o in outs)
                first_sight[variant] = [dict(op=op, shapes=shapes, chosen=chosen, us=us)
                                        for op, shapes, chosen, us in dispatch.first_sight_report(exclude=before)]
        gc.collect()
        gc.freeze()  # the compiles' objects must not slow the host through the collector's passes
        per_round = {variant: [] for variant in fns}
        order = list(fns)
        for r in range(rounds):
            for variant in (order if r % 2 == 0 else order[::-1]):
                per_round[variant].append(step_times(lambda: fns[variant](**kwargs), device, repeats))
        gc.unfreeze()
    steps = {v: {k: statistics.median(t[k] for t in times) for k in ("ms", "pipelined_ms", "host_ms")}
             for v, times in per_round.items()}
    ratios = {}
    for variant in ours:
        ratios[variant] = {}
        for rival in rivals:
            ratios[variant][rival] = {}
            for key in KEYS:
                each = [o[key] / t[key] for o, t in zip(per_round[variant], per_round[rival])]
                ratios[variant][rival][key] = [statistics.median(each), min(each), max(each)]
    best = min((v for v in INDUCTOR if v in steps), key=lambda v: steps[v]["ms"], default=None)
    case = dict(model=name, size=size, rounds=rounds, repeats=repeats, steps=steps, ratios=ratios,
                inductor_best=best, equal=equal, first_sight=first_sight)
    print(f"bench.rivals: {case}", file=sys.stderr, flush=True)
    return [case]


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "rivals")
    rivals = [v for v in VARIANTS if any(v in c["steps"] and v not in c["ratios"] for c in result["cases"])]
    inductor = [v for v in INDUCTOR if v in rivals]
    others = [v for v in rivals if v not in INDUCTOR]
    names = {"eager": "eager", "inductor": "Inductor", "inductor_reduce_overhead": "Inductor reduce-overhead"}
    lines = [f"# sgdiff against Inductor, in one process ({result['gpu']})",
             f"{versions} Median step in ms over the rounds (synchronized: from an idle GPU to the step's last "
             "kernel; pipelined: calls back to back); each sgdiff variant's ratio to each rival, the median of the "
             "rounds' ratios and their range. `sgdiff_default` is the plain call (lossless, CUDA graphs; on Hopper "
             "with `sgdiff[gemm]` the gemm family too, from ffda80f on).", "",
             "| model | sgdiff variant | timing | " + " | ".join(names.get(v, v) for v in rivals) + " | sgdiff | "
             + ("/ Inductor best (range) | " if inductor else "")
             + "".join(f"/ {names.get(v, v)}{' (range)' if not inductor and i == 0 else ''} | "
                       for i, v in enumerate(others)) + "equal |",
             "| --- " * (4 + len(rivals) + bool(inductor) + len(others)) + "| --- |"]
    for c in result["cases"]:
        s = c["steps"]
        for variant, r in c["ratios"].items():
            for key, label in (("ms", "synchronized"), ("pipelined_ms", "pipelined")):
                tree = f", {c['commit']}" if c.get("commit", result["commit"]) != result["commit"] else ""
                cells = [f"{s[v][key]:.2f}" if v in s else "—" for v in rivals] + [f"{s[variant][key]:.2f}"]
                if inductor:
                    best = min((v for v in inductor if v in s), key=lambda v: s[v][key], default=None)
                    mid, low, high = r[best][key] if best else (None,) * 3
                    cells.append(f"**{mid:.3f}** ({low:.3f}-{high:.3f})" if best else "—")
                for i, v in enumerate(others):
                    if v not in r:
                        cells.append("—")
                    elif not inductor and i == 0:
                        cells.append("**{:.3f}** ({:.3f}-{:.3f})".format(*r[v][key]))
                    else:
                        cells.append(f"{r[v][key][0]:.3f}")
                lines.append(f"| {c['model']} ({c['size']}{tree}) | {variant} | {label} | " + " | ".join(cells)
                             + f" | {'yes' if c['equal'][variant] else 'NO'} |")
    chosen = [f"- {c['model']} ({c['size']}), {variant}: " + "; ".join(
                  f"{op} " + ", ".join(f"{label} {n}" for label, n in sorted(by_label.items()))
                  for op, by_label in sorted(_chosen_by_op(sites).items()))
              for c in result["cases"] for variant, sites in c.get("first_sight", {}).items() if sites]
    if chosen:
        lines += ["", "What first sight chose at the signatures each sgdiff variant met first (sites of one "
                  "signature count once; `reference`: the eager chain, a GEMM's on cuBLAS):", "", *chosen]
    (out / "rivals.md").write_text("\n".join(lines) + "\n")


def _chosen_by_op(sites: list) -> dict:
    """``{op: {chosen implementation (backend and, for a GEMM, its tile's kind): signatures}}``."""
    found: dict = collections.defaultdict(collections.Counter)
    for site in sites:
        found[site["op"]][" ".join(site["chosen"].split()[:2]) or "reference"] += 1
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="flux,sana,wan")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ours", default=",".join(OURS), help="the sgdiff variants timed (bench/models.py's names)")
    parser.add_argument("--rivals", default=",".join(RIVALS), help="the variants ours are compared with")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    ours, rivals = tuple(args.ours.split(",")), tuple(args.rivals.split(","))
    unknown = [v for v in ours if v not in VARIANTS or not v.startswith("sgdiff")]
    if unknown:
        parser.error(f"not sgdiff variants of bench/models.py: {', '.join(unknown)}")
    unknown = [v for v in rivals if v not in VARIANTS or v in ours]
    if unknown:
        parser.error(f"rivals not among bench/models.py's variants, or among --ours: {', '.join(unknown)}")
    return each_model(args, lambda name: run_model(name, args.size, torch.device(args.device),
                                                   getattr(torch, args.dtype), args.rounds, args.repeats, ours,
                                                   rivals),
                      write_report)


if __name__ == "__main__":
    raise SystemExit(main())
