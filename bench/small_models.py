"""Small-model bench: the default call against eager where launch time weighs most.

    python -m bench.small_models [--cases flux,sana,...,vae_flux_1024] [--variants eager,sgdiff_default]
                                 [--profiled sgdiff_default] [--out bench/results]

Cases: every DiT of the zoo at ``blocks2`` (its real hidden size and inputs, two blocks), and the
VAE decodes ``vae_flux_1024`` (Flux's ``AutoencoderKL`` decoding a 1024² image) and
``vae_wan_480p_81f`` (Wan 2.1's ``AutoencoderKLWan`` decoding 480p x 81 frames), bf16, random
weights. Variants: ``eager``; ``sgdiff_default`` (``torch.compile(m, backend="sgdiff")``, no
mode, no options); optionally ``sgdiff_no_cudagraphs`` and ``inductor`` (Inductor's default).
All variants of a case run in one process, timed alternating (wall time of a call up to its
last kernel: ``--calls`` calls and a synchronize per round, median of ``--rounds``), after
warm-up calls that include any CUDA-graph capture; ``equal``: every call's output
``torch.equal`` to eager's. ``--profiled`` adds where each named variant's GPU time goes.
Writes small_models.json (``{gpu, torch, triton, commit, cases: [{model, eager_ms,
sgdiff_default_ms, equal, ...}]}``) and small_models.md.
"""
from __future__ import annotations

import argparse
import gc
import pathlib
import sys
import time
from typing import Callable, Dict, Tuple

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json, fold_runs, merge_cases, run_header, run_label  # noqa: E402
from bench.timing import alternating  # noqa: E402

VARIANTS = {
    "eager": None,
    "sgdiff_default": dict(backend="sgdiff"),
    "sgdiff_no_cudagraphs": dict(backend="sgdiff", options={"cudagraphs": False}),
    "inductor": dict(backend="inductor"),
}
VAES = ("vae_flux_1024", "vae_wan_480p_81f")


def cases():
    from sgdiff import zoo

    return [name for name, case in zoo.MODELS.items() if "blocks2" in case.sizes] + list(VAES)


def build(case: str, device: torch.device, dtype) -> Tuple[Callable, Callable]:
    """``(call, target)``: ``call(fn)`` runs one step (or decode) through ``fn``: ``target`` (the
    model, or ``vae.decode``) or what ``torch.compile`` made of it."""
    from sgdiff import zoo

    if case in VAES:
        vae = (zoo._flux_vae if case == "vae_flux_1024" else zoo._wan_vae)("full")
        vae = vae.to(device=device, dtype=dtype).eval().requires_grad_(False)
        g = torch.Generator().manual_seed(0)
        shape = (1, 16, 128, 128) if case == "vae_flux_1024" else (1, 16, 21, 60, 104)
        z = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
        return (lambda fn: fn(z, return_dict=False)[0]), vae.decode
    model, kwargs = zoo.build(case, "blocks2", dtype=dtype, device=device)
    return (lambda fn: fn(**kwargs)[0]), model


def run_case(case: str, variants, device: torch.device, dtype, calls: int, rounds: int, profiled=(),
             specs: Dict[str, dict] = VARIANTS) -> dict:
    """One case's row; ``specs``: variant -> ``torch.compile``'s arguments (None: eager)."""
    call, target = build(case, device, dtype)
    row = {"model": case}
    # The variants compile the same code, and dynamo's recompile limit counts every backend's
    # entries together: where a model's graph breaks make it compile a frame once per shape
    # (Wan's decode under torch 2.11, cat-pad-wan-2026-12-04.md), a variant compiled second
    # would run those frames eagerly. Each compiled variant gets the budget a lone process has
    # (the first may then compile a frame a lone process leaves eager: Wan's decode with a limit
    # of 64 ran in 1645 ms against 1644 with the default 8).
    compiled = sum(specs[v] is not None for v in variants)
    budget = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=budget * max(compiled, 1)):
        return _run_case(row, call, target, variants, device, calls, rounds, profiled, specs)


def _run_case(row: dict, call, target, variants, device: torch.device, calls: int, rounds: int, profiled,
              specs: Dict[str, dict]) -> dict:
    from bench.models import breakdown

    fns: Dict[str, Callable[[], torch.Tensor]] = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        want = None
        for variant in variants:
            spec = specs[variant]
            fn = target if spec is None else torch.compile(target, **spec)
            t0 = time.perf_counter()
            out = call(fn)
            sync()
            row[f"{variant}_first_call_s"] = round(time.perf_counter() - t0, 3)
            if device.type == "cuda":  # a call's peak, the model and one output (two, past eager's) held
                torch.cuda.reset_peak_memory_stats()
                call(fn)
                sync()
                row[f"{variant}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            outs = [out] + [call(fn) for _ in range(3)]  # past warm-up and capture
            if variant == "eager":
                want = out
            row[f"{variant}_equal"] = all(torch.equal(o, want) for o in outs)
            fns[variant] = (lambda fn=fn: call(fn))
            del outs, out
        gc.collect()
        for variant, seconds in alternating(fns, calls, rounds, sync).items():
            row[f"{variant}_ms"] = round(seconds * 1e3, 3)
        for variant in profiled:
            if variant in fns:
                row[f"{variant}_breakdown_ms"] = breakdown(fns[variant], device)
    row["equal"] = all(row.get(f"{v}_equal", True) for v in variants if v.startswith("sgdiff"))
    if "eager_ms" in row and "sgdiff_default_ms" in row:
        row["sgdiff_default_vs_eager"] = round(row["sgdiff_default_ms"] / row["eager_ms"], 3)
    return row


def merge_runs(old: dict, new: dict) -> dict:
    """``old`` with the cases ``new`` ran in their place, each tagged with its run's commit, in
    :func:`cases`' order."""
    order = cases()
    return merge_cases(old, new, key=lambda c: c["model"],
                       rank=lambda m: order.index(m) if m in order else len(order))


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "small_models")
    shown = [v for v in VARIANTS if any(f"{v}_ms" in c for c in result["cases"])]
    lines = [f"# Small models and VAE decodes: the default call against eager ({result['gpu']})", "",
             f"{versions} {result.get('dtype', 'bfloat16')}, random weights; DiTs at their real hidden size "
             "and inputs with two blocks. "
             "ms: wall time of a call up to its last kernel, variants alternating in one process (median); "
             "sgdiff_default: `torch.compile(m, backend=\"sgdiff\")`, no mode, no options; equal: every "
             "sgdiff output torch.equal to eager's; peak GiB: the most memory allocated during a call past the "
             "first (the model, its output and, past eager's, eager's output held; '-': not measured).", "",
             "| case | " + " | ".join(f"{v} ms" for v in shown) + " | default / eager | equal | peak GiB ("
             + " / ".join(shown) + f") | {run_header(result)} |",
             "|" + " --- |" * (len(shown) + 5)]
    for c in result["cases"]:
        ratio = c.get("sgdiff_default_vs_eager")
        lines.append(f"| {c['model']} | " + " | ".join(f"{c[f'{v}_ms']:.2f}" if f"{v}_ms" in c else "-" for v in shown)
                     + f" | {'-' if ratio is None else f'{ratio:.3f}'} | {c['equal']} | "
                     + " / ".join(f"{c[f'{v}_peak_gib']:.2f}" if f"{v}_peak_gib" in c else "-" for v in shown)
                     + f" | {run_label(c, result)} |")
    (out / "small_models.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(cases()))
    parser.add_argument("--variants", default="eager,sgdiff_default")
    parser.add_argument("--profiled", default="", help="variants whose GPU time is broken down")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--merge", nargs="+", metavar="SMALL_MODELS_JSON",
                        help="no measuring: fold these results (earliest first) into --out's small_models.json")
    args = parser.parse_args(argv)
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "small_models.json", args.merge, merge_runs, write_report)
        return 0
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown or variants[0] != "eager":
        parser.error(f"variants: eager first, then any of {', '.join(VARIANTS)}")
    meta = dict(_meta(), dtype=args.dtype)
    if args.device != "cuda":
        meta["gpu"] = "cpu"
    rows = []
    for case in args.cases.split(","):
        torch._dynamo.reset()
        rows.append(run_case(case, variants, torch.device(args.device), getattr(torch, args.dtype), args.calls,
                             args.rounds, [p for p in args.profiled.split(",") if p]))
        print(rows[-1], flush=True)
        write_report(dict(meta, cases=rows), pathlib.Path(args.out))  # a run cut short keeps what it measured
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
