"""Model benchmark: one denoising step of real DiTs (random weights), eager vs Inductor vs sgdiff.

    python -m bench.models [--models flux,sana,wan] [--size full] [--out bench/results]

For each model, in one run: median step time (CUDA events) and first-call time of eager,
``torch.compile`` default (Inductor) and with ``mode="reduce-overhead"`` (``inductor_best_ms``:
the faster), sgdiff's default call (``sgdiff_default``: no mode, no options, so lossless with
CUDA graphs), sgdiff lossless without and with CUDA graphs, with CUDA graphs and the gemm family
(off by default), sgdiff extra-high, and ``aot_eager`` (the capture alone); peak memory;
``torch.equal`` of every lossless output with eager and the max difference of the others; a
20-step Euler flow-matching trajectory of lossless sgdiff against eager, step by step; what
first sight chose at each GEMM signature; and where the GPU time of a step goes (GEMM,
attention, sgdiff kernels, other kernels, gaps; ``--profiled`` says for which variants).
Writes models.json and models.md.

On a GPU each variant runs in a process of its own (``--no-isolate`` to share one): a step's
host time depends on what ran before it in the process. Measured on the H200 host: sgdiff
without CUDA graphs on Sana read 55 ms per step after other variants and their profiles in
one process, and 28 ms in a process of its own.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, fold_runs  # noqa: E402
from bench.timing import alternating  # noqa: E402

VARIANTS = {
    "eager": None,
    "inductor": dict(backend="inductor"),
    "inductor_reduce_overhead": dict(backend="inductor", mode="reduce-overhead"),
    "aot_eager": dict(backend="aot_eager"),
    "sgdiff_default": dict(backend="sgdiff"),  # the plain call: lossless, CUDA graphs (the default)
    "sgdiff": dict(backend="sgdiff", options={"cudagraphs": False}),  # lossless, no CUDA graphs
    "sgdiff_cudagraph": dict(backend="sgdiff", options={"cudagraphs": True}),
    # the gemm family everywhere, and nowhere (by default it runs where the CuTe DSL GEMM does)
    "sgdiff_cudagraph_gemm": dict(backend="sgdiff", options={"cudagraphs": True, "gemm": True}),
    "sgdiff_cudagraph_nogemm": dict(backend="sgdiff", options={"cudagraphs": True, "gemm": False}),
    "sgdiff_extra_high": dict(backend="sgdiff", options={"quality": "extra-high", "cudagraphs": False}),
    "sgdiff_extra_high_cudagraph": dict(backend="sgdiff", options={"quality": "extra-high", "cudagraphs": True}),
}
SGDIFF_LOSSLESS = ("sgdiff_default", "sgdiff", "sgdiff_cudagraph", "sgdiff_cudagraph_gemm", "sgdiff_cudagraph_nogemm")
LOSSLESS = ("eager", "aot_eager", *SGDIFF_LOSSLESS)
PROFILED = ("eager", "inductor", "sgdiff")  # where the GPU time of a step goes
PAIRED = ("aot_eager", "sgdiff")  # also timed with eager's steps interleaved, in one process


@functools.lru_cache(maxsize=None)
def sgdiff_kernel_names() -> tuple:
    """The names sgdiff's Triton kernels launch under (a profiler event's name), read from the
    modules of ``sgdiff.kernels.triton`` so that a new kernel is counted without a list to keep."""
    import importlib
    import pkgutil

    import triton

    import sgdiff.kernels.triton as package
    from sgdiff.kernels.triton.launch import LeanKernel

    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        names |= {fn.__name__ for fn in vars(module).values()
                  if isinstance(fn, (triton.runtime.JITFunction, LeanKernel)) and fn.__name__.endswith("_kernel")}
    return tuple(sorted(names))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_times(fn: Callable, device: torch.device, repeats: int) -> Dict[str, float]:
    """One call's time in ms, three ways (medians over ``repeats``):

    ``ms``, from an idle GPU to the call's last kernel (CUDA events around the call; wall
    clock on CPU); ``host_ms``, until the call returns to Python (the host's share); and
    ``pipelined_ms``, the mean of ``repeats`` calls issued back to back, as a denoising loop
    issues them (host and GPU overlap)."""
    times, host = [], []
    for _ in range(repeats):
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            host.append(times[-1])
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    pipelined = (time.perf_counter() - t0) * 1e3 / repeats
    return dict(ms=statistics.median(times), host_ms=statistics.median(host), pipelined_ms=pipelined)


def paired_times(eager: Callable, fn: Callable, device: torch.device, repeats: int) -> Dict[str, float]:
    """Median time of a step (call to its last kernel, synchronized) of ``fn`` and of eager, the
    two alternating in one process: host speed drifts between processes and over minutes (eager
    Sana read 26 and 40 ms a step in two runs of the same code), which a ratio taken this way
    cancels."""
    steps = alternating({"paired_eager_ms": eager, "paired_ms": fn}, 1, repeats, lambda: _sync(device))
    return {key: t * 1e3 for key, t in steps.items()}


def euler(fn: Callable, kwargs: dict, steps: int):
    """Flow-matching Euler: x <- x + (t_next - t) * v(x, t); returns every intermediate x."""
    latents, out = kwargs["hidden_states"].clone(), []
    scale = 1000.0 if float(kwargs["timestep"].flatten()[0]) > 1 else 1.0  # Sana/PixArt/Wan: 0..1000
    for i in range(steps):
        t, t_next = 1 - i / steps, 1 - (i + 1) / steps
        v = fn(**dict(kwargs, hidden_states=latents, timestep=torch.full_like(kwargs["timestep"], t * scale)))[0]
        latents = latents + (t_next - t) * v
        out.append(latents)
    return out


def breakdown(fn: Callable, device: torch.device, top: int = 25) -> Dict[str, object]:
    """GPU time of one call by kernel category, in ms, the gaps between kernels, and the
    ``top`` kernels by total time (``[name, ms, calls]``), which say where a gap comes from."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return {}
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    wall = (time.perf_counter() - t0) * 1e3
    cats = {"gemm": 0.0, "attention": 0.0, "sgdiff": 0.0, "other": 0.0}
    ours, our_calls = sgdiff_kernel_names(), 0
    per_kernel: Dict[str, list] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name, ms = e.name.lower(), e.device_time / 1e3
        entry = per_kernel.setdefault(e.name[:120], [0.0, 0])
        entry[0] += ms
        entry[1] += 1
        if e.name in ours and "gemm" not in name:  # first: _linear_attention_out_kernel is ours
            cats["sgdiff"] += ms  # (sgdiff's GEMMs, epilogues included, count as GEMMs)
            our_calls += 1
        elif any(k in name for k in ("gemm", "cutlass", "xmma", "nvjet", "matmul", "cublas")):
            cats["gemm"] += ms
        elif any(k in name for k in ("flash", "fmha", "attention", "sdpa")):
            cats["attention"] += ms
        else:
            cats["other"] += ms
    cats["gaps_and_host"] = max(0.0, wall - sum(cats.values()))
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(cats, sgdiff_kernel_calls=our_calls,
                top_kernels=[[name, round(ms, 4), calls] for name, (ms, calls) in ranked])


def run_model(name: str, size: str, device: torch.device, dtype, variants, repeats: int, steps: int,
              on_update: Callable[[dict], None] = lambda row: None, profiled=PROFILED) -> dict:
    from sgdiff import zoo

    model, kwargs = zoo.build(name, size, dtype=dtype, device=device)
    row = {"model": name, "size": size, "dtype": str(dtype).removeprefix("torch."),
           "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    with torch.no_grad():
        want = model(**kwargs)[0]
        for variant in variants:
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            spec = VARIANTS[variant]
            fn = model if spec is None else torch.compile(model, **spec)
            _sync(device)
            t0 = time.perf_counter()
            out = fn(**kwargs)[0].clone()
            _sync(device)
            row[f"{variant}_first_call_s"] = time.perf_counter() - t0
            # past warm-up and capture; copies: a CUDA graph of Inductor's (reduce-overhead) writes
            # each call's output where the last call's was, and refuses a read of an overwritten one
            outs = [out] + [fn(**kwargs)[0].clone() for _ in range(3)]
            # what earlier variants and compiles left behind must not slow this one's host: the
            # garbage collector's full passes walk every live object (~700k after a compile)
            gc.collect()
            gc.freeze()
            # when each variant's timing starts, to read beside a log of the GPU's clocks and power
            print(f"bench.models: {name} {variant} timed from {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
            for key, value in step_times(lambda: fn(**kwargs), device, repeats).items():
                row[f"{variant}_{key}"] = value
            if variant in PAIRED:
                for key, value in paired_times(lambda: model(**kwargs), lambda: fn(**kwargs), device,
                                               2 * repeats).items():
                    row[f"{variant}_{key}"] = value
            gc.unfreeze()
            row[f"{variant}_equal"] = all(torch.equal(o, want) for o in outs)
            row[f"{variant}_max_diff"] = max(float((o.float() - want.float()).abs().max()) for o in outs)
            if device.type == "cuda":
                row[f"{variant}_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if variant in profiled:
                row[f"{variant}_breakdown_ms"] = _reported(row, variant, breakdown, lambda: fn(**kwargs), device)
            if variant in SGDIFF_LOSSLESS and steps:
                row["trajectory_steps"] = steps
                row[f"{variant}_trajectory_equal"] = _reported(row, variant, lambda: all(
                    torch.equal(a, b) for a, b in zip(euler(fn, kwargs, steps), euler(model, kwargs, steps))))
            if variant.startswith("sgdiff"):
                row[f"{variant}_gemm_choices"] = gemm_choices()
            outs = None  # free before the next variant
            on_update(row)
    torch._dynamo.reset()
    return summarize(row)


def run_isolated(name: str, variants, common_args, on_update: Callable[[dict], None] = lambda row: None) -> dict:
    """:func:`run_model` with each variant in a fresh process of this script; one merged row."""
    row: dict = {}
    for variant in variants:
        with tempfile.TemporaryDirectory() as tmp:
            # as a module from the checkout's root: run as a script, bench/ would lead sys.path and its
            # kernels.py would stand for the `kernels` package that transformers looks for
            done = subprocess.run([sys.executable, "-m", "bench.models", "--models", name, "--variants",
                                   variant, "--no-isolate", "--out", tmp, *common_args],
                                  cwd=pathlib.Path(__file__).resolve().parent.parent)
            if done.returncode:  # the variant's failure is in its row; the other variants still run
                print(f"bench.models: {name} {variant} failed (exit status {done.returncode})", file=sys.stderr)
                row.setdefault(f"{variant}_errors", []).append(f"its process exited with status {done.returncode}")
                continue
            row.update(json.loads((pathlib.Path(tmp) / "models.json").read_text())["cases"][0])
        on_update(row)
    return summarize(row)


def _reported(row: dict, variant: str, measure: Callable, *args):
    """``measure(*args)``; where it raises, None, with the error in ``row[variant + "_errors"]``
    and on stderr (a step's time and bits stay measured)."""
    try:
        return measure(*args)
    except Exception as exc:  # noqa: BLE001 - a report of what failed, not a fix
        import traceback

        traceback.print_exc()
        row.setdefault(f"{variant}_errors", []).append(f"{getattr(measure, '__name__', 'measure')}: "
                                                       f"{type(exc).__name__}: {exc}"[:500])
        return None


def gemm_choices() -> list:
    """What first sight chose at each tuned signature of the model (the gemm family's):
    ``[op, [shapes], chosen, {candidate: µs}]`` (:func:`sgdiff.kernels.dispatch.first_sight_report`)."""
    from sgdiff.kernels import dispatch

    return [[op, [list(s) for s in shapes], chosen, {k: round(v, 1) for k, v in times.items()}]
            for op, shapes, chosen, times in dispatch.first_sight_report()]


def summarize(row: dict) -> dict:
    """Add the headline fields: the best lossless sgdiff configuration and its equality."""
    lossless = [v for v in SGDIFF_LOSSLESS if row.get(f"{v}_ms") is not None and row[f"{v}_equal"]]
    if lossless:
        best = min(lossless, key=lambda v: row[f"{v}_ms"])
        row["sgdiff_lossless_ms"], row["sgdiff_lossless_best"] = row[f"{best}_ms"], best
    row["sgdiff_lossless_equal"] = all(row.get(f"{v}_equal", True) for v in SGDIFF_LOSSLESS)
    inductor = [row.get(f"{v}_ms") for v in ("inductor", "inductor_reduce_overhead")]
    if None not in inductor:  # Inductor's best: the faster of its default and reduce-overhead (CUDA graphs)
        row["inductor_best_ms"] = min(inductor)
    else:
        row.pop("inductor_best_ms", None)
    row["compile_s"] = row.get("sgdiff_default_first_call_s", row.get("sgdiff_first_call_s"))
    trajectories = [row[f"{v}_trajectory_equal"] for v in VARIANTS if f"{v}_trajectory_equal" in row]
    if trajectories:
        row["trajectory_equal"] = all(trajectories)
    return row


def merge_runs(old: dict, new: dict) -> dict:
    """Results ``old`` with the run ``new`` folded in variant by variant: a model's case takes the
    fields of the variants ``new`` measured, each tagged ``<variant>_commit``, and keeps the rest."""
    def measured(case):
        return [v for v in VARIANTS if f"{v}_equal" in case]

    cases = {}
    for c in old["cases"]:
        cases[c["model"]] = dict(c, **{f"{v}_commit": c.get(f"{v}_commit", c.get("commit", old["commit"]))
                                       for v in measured(c)})
    for c in new["cases"]:
        commit = c.get("commit", new["commit"])
        row = cases.setdefault(c["model"], {})
        row.update(c, **{f"{v}_commit": commit for v in measured(c)})
        row["commit"] = row.get("sgdiff_commit", commit)  # the case's commit: its sgdiff figures'
    return dict(new, cases=[summarize(row) for row in cases.values()])


def _commits(case: dict) -> str:
    """``model commit``, and any variant measured at another commit."""
    others = [f"{v} {case[f'{v}_commit']}" for v in VARIANTS
              if case.get(f"{v}_commit", case.get("commit")) != case.get("commit")]
    return f"{case['model']} {case.get('commit')}" + (f" ({', '.join(others)})" if others else "")


def write_report(result: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.json").write_text(json.dumps(result, indent=1))
    cols = [v for v in VARIANTS if any(f"{v}_ms" in c for c in result["cases"])]
    lines = [f"# sgdiff on diffusers DiTs ({result['gpu']})",
             f"torch {result['torch']}, triton {result['triton']}, commit "
             + (", ".join(_commits(c) for c in result["cases"])
                if any("commit" in c for c in result["cases"]) else result["commit"]) + ". "
             "Median step time in ms; '=' marks an output torch.equal to eager, else the max abs diff.", "",
             "| model | " + " | ".join(cols) + " | Euler trajectory (steps) equal |",
             "|" + " --- |" * (len(cols) + 2)]
    for c in result["cases"]:
        cells = []
        for v in cols:
            ms = c.get(f"{v}_ms")
            if f"{v}_equal" not in c:
                cells.append("-")
                continue
            tag = "=" if c[f"{v}_equal"] else f"±{c[f'{v}_max_diff']:.3g}"
            cells.append(f"{'-' if ms is None else f'{ms:.2f}'} ({tag}, first call {c[f'{v}_first_call_s']:.1f} s)")
        lines.append(f"| {c['model']} ({c['size']}, {c['dtype']}) | " + " | ".join(cells)
                     + f" | {c.get('trajectory_equal', '-')} ({c.get('trajectory_steps', '-')}) |")
    lines += ["", "Best lossless sgdiff configuration against Inductor (the ratio is sgdiff time / Inductor time; "
              "below 1 is faster; Inductor's best: the faster of its default and reduce-overhead):", "",
              "| model | eager | Inductor | Inductor best | sgdiff lossless | config | / Inductor | / Inductor best | "
              "equal | first call / aot_eager |", "|" + " --- |" * 10]

    def ms(value):
        return "-" if value is None else f"{value:.2f}"

    def ratio(a, b):
        return "-" if None in (a, b) else f"{a / b:.3f}"

    for c in result["cases"]:
        best, ind, aot = c.get("sgdiff_lossless_ms"), c.get("inductor_ms"), c.get("aot_eager_first_call_s")
        ind_best = c.get("inductor_best_ms")
        first = c.get(f"{c.get('sgdiff_lossless_best')}_first_call_s")
        lines.append(f"| {c['model']} | {ms(c.get('eager_ms'))} | {ms(ind)} | {ms(ind_best)} | {ms(best)} | "
                     f"{c.get('sgdiff_lossless_best', '-')} | {ratio(best, ind)} | {ratio(best, ind_best)} | "
                     f"{c.get('sgdiff_lossless_equal')} | {ratio(first, aot)} |")
    if any(f"{v}_host_ms" in c for c in result["cases"] for v in cols):
        lines += ["", "Host time of one step: the call's return to Python / a step's share of calls issued back to "
                  "back (ms; a step slower than both is host-bound):", "", "| model | " + " | ".join(cols) + " |",
                  "|" + " --- |" * (len(cols) + 1)]
        for c in result["cases"]:
            cells = [f"{c[f'{v}_host_ms']:.2f} / {c[f'{v}_pipelined_ms']:.2f}" if f"{v}_host_ms" in c else "-"
                     for v in cols]
            lines.append(f"| {c['model']} | " + " | ".join(cells) + " |")
    paired = [v for v in PAIRED if any(f"{v}_paired_ms" in c for c in result["cases"])]
    if paired:
        lines += ["", "Without CUDA graphs, steps alternating with eager's in one process (ms, synchronized; "
                  "host speed drifts between processes, the ratio is what to read):", "",
                  "| model | variant | eager | variant | / eager |", "|" + " --- |" * 5]
        for c in result["cases"]:
            for v in paired:
                if f"{v}_paired_ms" in c:
                    e, t = c[f"{v}_paired_eager_ms"], c[f"{v}_paired_ms"]
                    lines.append(f"| {c['model']} | {v} | {e:.2f} | {t:.2f} | {t / e:.3f} |")
    lines += ["", "GPU time of one step by kernel category (ms; gaps_and_host = wall time not covered by kernels):",
              "", "| model | variant | gemm | attention | sgdiff | other | gaps_and_host |", "|" + " --- |" * 7]
    for c in result["cases"]:
        for v in VARIANTS:
            b = c.get(f"{v}_breakdown_ms")
            if b:
                lines.append(f"| {c['model']} | {v} | " + " | ".join(f"{b.get(k, 0):.2f}" for k in
                             ("gemm", "attention", "sgdiff", "other", "gaps_and_host")) + " |")
    for c in result["cases"]:
        for v in VARIANTS:
            top = (c.get(f"{v}_breakdown_ms") or {}).get("top_kernels")
            if top:
                lines += ["", f"Top kernels of one {c['model']} step, {v} (ms, calls):", ""]
                lines += [f"- {ms:.3f} ms, {calls}x `{name}`" for name, ms, calls in top]
    (out / "models.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="flux,sana,wan")
    parser.add_argument("--size", default="full")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--profiled", default=",".join(PROFILED),
                        help="the variants whose step is profiled (GPU time by kernel category)")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="each variant in its own process (default: on a GPU)")
    parser.add_argument("--merge", nargs="+", metavar="MODELS_JSON",
                        help="no measuring: merge these results (earliest first) into --out's models.json, "
                             "variant by variant")
    args = parser.parse_args(argv)
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "models.json", args.merge, merge_runs, write_report)
        return 0
    from tqdm import tqdm

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; valid: {', '.join(VARIANTS)}")
    meta = _meta()
    if device.type != "cuda":
        meta["gpu"] = "cpu"
    rows: list = []

    def save(row: dict) -> None:  # after every variant: a run cut short keeps what it measured
        write_report(dict(meta, cases=rows + [summarize(dict(row))]), pathlib.Path(args.out))

    isolate = device.type == "cuda" if args.isolate is None else args.isolate
    common = ["--size", args.size, "--device", args.device, "--dtype", args.dtype, "--repeats", str(args.repeats),
              "--steps", str(args.steps), "--profiled", args.profiled]
    for name in tqdm(args.models.split(","), desc="models", file=sys.stdout):
        if isolate and len(variants) > 1:
            rows.append(run_isolated(name, variants, common, save))
        else:
            rows.append(run_model(name, args.size, device, dtype, variants, args.repeats, args.steps, save,
                                  tuple(args.profiled.split(","))))
        tqdm.write(json.dumps({k: v for k, v in rows[-1].items() if not isinstance(v, dict)}))
        write_report(dict(meta, cases=rows), pathlib.Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
