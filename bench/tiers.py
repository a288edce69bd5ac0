"""Tier bench: what each quality tier buys (step time) and costs (fidelity over a trajectory).

    python -m bench.tiers [--models flux,wan,sana] [--tiers lossless,extra-high,high] [--steps 50]

Per model, in one process: the transformer compiled once with ``backend="sgdiff"`` and run at
each tier through the per-call switch (``with sgdiff.quality(tier)``: one compiled variant per
tier, none shared); each tier's step time (CUDA events, median of ``--repeats``; the tiers
timed in turn, three rounds, the median round kept and the range given); the sites each tier's
rewrites took, per family; and a ``--steps``-step Euler flow-matching trajectory
per tier from the same noise (bench/models.py's ``euler``). Random weights make image metrics
meaningless, so the figure is the PSNR of the final latents against lossless's,
``10 log10(peak^2 / MSE)`` with ``peak`` lossless's largest magnitude (inf where equal), and
the largest per-step max |difference| along the way. Writes tiers.json and tiers.md:
``{gpu, torch, triton, commit, cases: [{model, tier, step_ms, lossless_ms, psnr_db_50,
max_diff_step}]}`` (``psnr_db_50`` is after ``--steps`` steps, 50 by default).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json  # noqa: E402
from bench.models import euler, step_times  # noqa: E402

TIERS = ("lossless", "extra-high", "high")


def tier_arguments(description: str, models: str, tiers: str) -> argparse.ArgumentParser:
    """A parser of the options every per-model, per-tier bench takes: ``--models``, ``--tiers``,
    ``--size``, ``--device``, ``--dtype`` and ``--out``, with these defaults for the first two."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", default=models)
    parser.add_argument("--tiers", default=tiers)
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="bench/results")
    return parser


def each_model(args: argparse.Namespace, run, write_report) -> int:
    """``run(model)``'s cases for each of ``--models``, the report rewritten after each model (a
    run cut short keeps what it measured)."""
    meta, cases = _meta(args.device), []
    for name in args.models.split(","):
        cases += run(name)
        write_report(dict(meta, cases=cases), pathlib.Path(args.out))
    return 0


def chosen_tiers(parser: argparse.ArgumentParser, text: str) -> list:
    """The tiers a ``--tiers`` argument names, in its order (a usage error on an unknown one)."""
    tiers = text.split(",")
    unknown = set(tiers) - set(TIERS)
    if unknown:
        parser.error(f"unknown tiers {sorted(unknown)}; valid: {', '.join(TIERS)}")
    return tiers


def psnr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR of ``x`` against ``ref`` in dB, the peak ``ref``'s largest magnitude (inf if equal)."""
    x, ref = x.double(), ref.double()
    mse = float(((x - ref) ** 2).mean())
    if mse == 0.0:
        return math.inf
    peak = float(ref.abs().max())
    return 10.0 * math.log10(peak * peak / mse)


def run_model(name: str, size: str, device: torch.device, dtype, tiers, repeats: int, steps: int,
              rounds: int = 3) -> list:
    import statistics

    import sgdiff
    from sgdiff import zoo
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options

    torch.manual_seed(0)
    model, kwargs = zoo.build(name, size, dtype=dtype, device=device)
    results = []  # every variant's pass results: the sites each tier's rewrites took
    compiled = torch.compile(model, backend=SgdiffBackend(Options(), on_result=results.append))
    order = ("lossless", *[t for t in tiers if t != "lossless"])
    samples = {tier: [] for tier in order}
    trajectories = {}
    with torch.no_grad():
        for tier in order:
            with sgdiff.quality(tier):
                for _ in range(3):  # compile this tier's variant, first sight of its kernels, its CUDA graphs
                    compiled(**kwargs)
        for _ in range(rounds):  # the tiers alternate, round after round
            for tier in order:
                with sgdiff.quality(tier):
                    samples[tier].append(step_times(lambda: compiled(**kwargs), device, repeats)["ms"])
        for tier in order:
            with sgdiff.quality(tier):
                trajectories[tier] = euler(compiled, kwargs, steps)
    times = {tier: statistics.median(ms) for tier, ms in samples.items()}
    chosen = _attention_choices()
    ref = trajectories["lossless"]
    rows = []
    for tier in tiers:
        path = trajectories[tier]
        sites = {}
        for r in results:
            if r.tier.value == tier:
                for family, count in r.counts.items():
                    if count:
                        sites[family] = sites.get(family, 0) + count
        rows.append(dict(model=name, size=size, tier=tier, step_ms=round(times[tier], 3),
                         step_ms_range=[round(min(samples[tier]), 3), round(max(samples[tier]), 3)],
                         lossless_ms=round(times["lossless"], 3), psnr_db_50=round(psnr_db(path[-1], ref[-1]), 2),
                         max_diff_step=max(float((a.float() - b.float()).abs().max()) for a, b in zip(path, ref)),
                         steps=steps, sites=sites, **({"attention_kernels": chosen} if tier != "lossless" else {})))
    return rows


def _attention_choices() -> list:
    """What first sight chose for the attention ops in this process: each signature's fused kernel
    (extra-high) and INT8 tile configuration (high)."""
    import sys

    found = []
    for name, label in (("sgdiff.kernels.sdpa", "attention"), ("sgdiff.kernels.triton.attention_int8", "attention_int8")):
        module = sys.modules.get(name)
        if module is not None:
            found += [dict(op=label, q=list(shape), chosen=str(choice)) for shape, choice in module.choices()]
    return found


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "tiers")
    lines = [f"# sgdiff's quality tiers ({result['gpu']})",
             f"{versions} Step time in ms (median), "
             "PSNR of the trajectory's final latents against lossless's (random weights: latents, not images), the "
             "largest per-step max |difference|.", "",
             "| model | tier | step | (range) | lossless | / lossless | steps | PSNR (dB) | max diff a step | sites |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in result["cases"]:
        low, high = c.get("step_ms_range", (c["step_ms"], c["step_ms"]))
        sites = ", ".join(f"{f} {n}" for f, n in sorted(c.get("sites", {}).items()))
        lines.append(f"| {c['model']} ({c['size']}) | {c['tier']} | {c['step_ms']:.2f} | {low:.2f}-{high:.2f} | "
                     f"{c['lossless_ms']:.2f} | {c['step_ms'] / c['lossless_ms']:.3f} | {c['steps']} | "
                     f"{c['psnr_db_50']} | {c['max_diff_step']:.3g} | {sites} |")
    kept = [f"- {c['model']} {c['tier']}: " + "; ".join(f"{a['op']} {tuple(a['q'])} {a['chosen']}"
                                                         for a in c["attention_kernels"])
            for c in result["cases"] if c.get("attention_kernels")]
    if kept:
        lines += ["", "What first sight kept for each attention signature (the fused kernel at extra-high; at high "
                  "the unquantized one, cuDNN's FP8 attention or an INT8 tile configuration):", "", *kept]
    (out / "tiers.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = tier_arguments(__doc__.splitlines()[0], "flux,wan,sana", ",".join(TIERS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    tiers = chosen_tiers(parser, args.tiers)
    return each_model(args, lambda name: run_model(name, args.size, torch.device(args.device),
                                                   getattr(torch, args.dtype), tiers, args.repeats, args.steps),
                      write_report)


if __name__ == "__main__":
    raise SystemExit(main())
