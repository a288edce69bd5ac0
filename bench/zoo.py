"""Zoo bench: every DiT of the zoo at its real hidden size on the GPU, as a new user would compile it.

    python -m bench.zoo [--cases flux,sana,...] [--out bench/results]

Per model (``blocks2``: the real widths and inputs, two blocks; bf16, random weights): the sites
the plain call (``torch.compile(m, backend="sgdiff")``) found and rewrote per family against those
:mod:`sgdiff.zoo.sites` expects (rewritten + missed), whether every output is ``torch.equal`` to
eager's, how many of sgdiff's kernels one call ran (from the profiler: the rewrites ran, not their
fallbacks), and eager and sgdiff wall time per call, alternating in one process (as
:mod:`bench.small_models` times them). Writes ``zoo.json`` (``{gpu, torch, triton, commit,
coverage, cases: [{model, found, expected, equal, sgdiff_kernels, eager_ms, sgdiff_ms}]}``) and
``zoo.md``. The rows carry small_models' keys too (``sgdiff_default_ms``): ``python -m
bench.small_models --merge bench/results/zoo.json`` folds them into ``small_models.json``.
"""
from __future__ import annotations

import argparse
import gc
import logging
import pathlib
import sys
from typing import Dict, List

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json, fold_runs, merge_cases, run_header, run_label  # noqa: E402
from bench.small_models import VARIANTS, run_case  # noqa: E402


def measure(name: str, device: torch.device, calls: int, rounds: int) -> dict:
    """One model's row: sites found (rewritten) per family in the timed compile itself."""
    from sgdiff import patterns
    from sgdiff.backend import SgdiffBackend
    from sgdiff.report import Report
    from sgdiff.tiers import DEFAULT_TIER
    from sgdiff.zoo import sites

    results: List = []
    # the plain call's backend (`backend="sgdiff"` builds this one), with a sink for each graph's results
    specs = dict(VARIANTS, sgdiff_default=dict(backend=SgdiffBackend(on_result=results.append)))
    row = run_case(name, ["eager", "sgdiff_default"], device, torch.bfloat16, calls, rounds,
                   profiled=["sgdiff_default"], specs=specs)
    if not row.get("eager_equal", True):
        # eager differs from itself (atomic float adds: a MoE's scatter_add combine): equality means
        # nothing there, so the whole case again with torch's deterministic kernels
        results.clear()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            row = dict(run_case(name, ["eager", "sgdiff_default"], device, torch.bfloat16, calls, rounds,
                                profiled=["sgdiff_default"], specs=specs), deterministic=True)
        finally:
            torch.use_deterministic_algorithms(False)
    report = Report.from_results(DEFAULT_TIER, results, patterns.families())
    expected = sites.expected(name, "bf16", "blocks2")
    row["found"] = {f: report.counts.get(f, 0) for f in expected}
    row["expected"] = expected
    row["unexpected"] = {f: n for f, n in report.counts.items() if n and f not in expected}
    row["skipped"] = sorted({f"{family}/{op}: {reason}" for family, op, reason in report.skipped})
    row["sgdiff_ms"] = row.get("sgdiff_default_ms")
    row["sgdiff_kernels"] = row.get("sgdiff_default_breakdown_ms", {}).get("sgdiff_kernel_calls")
    return row


def coverage(rows: List[dict]) -> Dict[str, float]:
    """Sites rewritten against expected over ``rows``, per model: a rewrite counted under another
    family than the expected one's (a cast LayerNorm the modulate family takes where the qk_norm
    family would) still counts, a rewrite beyond a model's expected total does not."""
    found = sum(min(sum(c["found"].values()) + sum(c.get("unexpected", {}).values()), sum(c["expected"].values()))
                for c in rows)
    expected = sum(sum(c["expected"].values()) for c in rows)
    return dict(found=found, expected=expected, share=round(found / expected, 4) if expected else None)


def merge_runs(old: dict, new: dict) -> dict:
    """``old`` with the models ``new`` ran in their place (each row tagged with its run's
    commit), in the zoo's order; what each model is expected to hold read from today's
    :mod:`sgdiff.zoo.sites` (a declaration, not a measurement), the coverage recomputed."""
    from sgdiff import zoo
    from sgdiff.zoo import sites

    order = list(zoo.MODELS)
    merged = merge_cases(old, new, key=lambda c: c["model"],
                         rank=lambda m: order.index(m) if m in order else len(order))
    for c in merged["cases"]:
        if c["model"] in sites.REWRITTEN:
            c["expected"] = sites.expected(c["model"], "bf16", "blocks2")
    return dict(merged, coverage=coverage(merged["cases"]))


def write_report(result: dict, out: pathlib.Path) -> None:
    from sgdiff.zoo import sites

    versions = _write_json(result, out, "zoo")
    cov, (done, due) = result["coverage"], sites.coverage()
    lines = [f"# The zoo at real width: sites, bits and time ({result['gpu']})", "",
             f"{versions} bf16, random weights, each DiT at its real hidden size and inputs with two blocks; "
             "`torch.compile(m, backend=\"sgdiff\")`, no mode, no options. found/expected: sites rewritten per "
             "family against those `sgdiff/zoo/sites.py` expects (rewritten + missed, with the reason there); "
             "equal: every output torch.equal to eager's (where eager's own outputs differ from call to call, both "
             "run with torch's deterministic kernels); sgdiff kernels: launches of sgdiff's kernels in one "
             "profiled call; ms: wall time of a call up to its last kernel, eager and sgdiff alternating in one "
             "process (median).", "",
             f"Sites rewritten over these models: {cov['found']} of {cov['expected']} ({cov['share']:.1%}). "
             f"Over the tiny configs in fp32 and bf16 (`sites.coverage()`, the CPU tests): {done} of {due} "
             f"({done / due:.1%}).", "",
             "| model | found / expected | equal | sgdiff kernels | eager ms | sgdiff ms | sgdiff / eager | "
             + run_header(result) + " |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in result["cases"]:
        sites_text = ", ".join(f"{f} {c['found'][f]}/{n}" for f, n in c["expected"].items() if n or c["found"][f])
        ratio = c.get("sgdiff_default_vs_eager")
        equal = f"{c['equal']} (deterministic kernels)" if c.get("deterministic") else c["equal"]
        lines.append(f"| {c['model']} | {sites_text} | {equal} | {c['sgdiff_kernels']} | {c['eager_ms']:.2f} | "
                     f"{c['sgdiff_ms']:.2f} | {'-' if ratio is None else f'{ratio:.3f}'} | {run_label(c, result)} |")
    (out / "zoo.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    from sgdiff import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(n for n, c in zoo.MODELS.items() if "blocks2" in c.sizes))
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--merge", nargs="+", metavar="ZOO_JSON",
                        help="no measuring: fold these results (earliest first) into --out's zoo.json")
    args = parser.parse_args(argv)
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "zoo.json", args.merge, merge_runs, write_report)
        return 0
    if not torch.cuda.is_available():
        parser.error("the zoo bench runs on a CUDA GPU (the CPU tests check the counts: tests/test_zoo.py)")
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    meta, rows = dict(_meta(), dtype="bfloat16"), []
    for name in args.cases.split(","):
        torch._dynamo.reset()
        try:
            rows.append(measure(name, torch.device("cuda"), args.calls, args.rounds))
        except Exception as e:  # one model's failure is a row of the report, not the end of the run
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            gc.collect()
            torch.cuda.empty_cache()
        print({k: v for k, v in rows[-1].items() if "breakdown" not in k}, flush=True)
        write_report(dict(meta, coverage=coverage(rows), cases=rows), pathlib.Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
