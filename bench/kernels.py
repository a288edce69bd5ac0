"""Kernel benchmark: each sgdiff op at real DiT shapes, against eager, Inductor and a copy.

    python bench/kernels.py [--out bench/results] [--ops layernorm_modulate,...] [--quick]
    python bench/kernels.py --merge RUN.json ...    # fold partial runs into --out's results
    python bench/kernels.py --across RUN.json ...   # sgdiff against Inductor and a copy over several runs

For every case, in one run: GPU time (CUDA-graph replays, alternating) of the eager chain, of
``torch.compile`` (default Inductor) on the same chain, of the sgdiff kernel, and of a copy of
the same bytes; wall time per call of eager and of sgdiff through its op; bit-exactness of the
sgdiff output (``torch.equal`` with eager). Writes kernels.json, kernels.md and kernels.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.timing import gpu_times, wall_us  # noqa: E402

COPY_BAR = 1.5  # a kernel should take at most this many times a copy of the bytes it moves


@dataclasses.dataclass
class Case:
    op: str
    shape: tuple
    dtype: torch.dtype
    note: str
    eager: Callable[[], torch.Tensor]  # the eager chain
    sgdiff_raw: Callable[[], torch.Tensor]  # the Triton launcher, called directly
    sgdiff_op: Callable[[], torch.Tensor]  # through torch.ops.sgdiff (dispatcher + checks)
    sgdiff_launcher: Callable[[], torch.Tensor]  # what a compiled graph with static shapes calls: a call site
    copy_src: torch.Tensor  # copying it moves as many bytes as the op must (read + write)
    # sgdiff's own kernel alone, where the op also runs another library's (a convolution's
    # epilogue on its output): what copy_src's bytes measure
    own_kernel: Optional[Callable[[], object]] = None


def bench_examples(ops: Optional[List[str]] = None, quick: bool = False, match: Optional[str] = None):
    """``(op, example)`` for every example an op declares for the bench (``quick``: each op's
    first; ``match``: those whose description holds it), in the registry's order of ops."""
    from sgdiff.kernels import registry

    for op in registry.ops():
        if ops is not None and op.name not in ops:
            continue
        chosen = [e for e in op.examples if e.bench] if op.triton_impl() is not None else []
        chosen = [e for e in chosen if match is None or match in e.label]
        yield from ((op, e) for e in chosen[:1 if quick else None])


def make_case(op, example, seed: int = 0) -> Case:
    """The case of one example, at its real sizes on the GPU: the model's spelling of the chain,
    the op's Triton implementation called directly, the op, and a call site."""
    from sgdiff.kernels import dispatch
    from sgdiff.kernels.dispatch import CallSite, tensor_positions

    args = example.args("cuda", seed=seed)
    want = dispatch.reference(op.name)(*args)
    impl, overload = op.triton_impl(), op.load()
    eager = example.chain(*args) if example.chain is not None else (lambda: dispatch.reference(op.name)(*args))
    launch = CallSite(op.name, tensor_positions(args))
    own = example.own_kernel(*args) if example.own_kernel is not None else None
    raw = impl.run
    if op.tuned:  # the implementation or variant first sight keeps (the reference, where it is the fastest)
        dispatch.run(op.name, *args)
        raw = dispatch.settled(op.name, *args) or raw
    return Case(op.name, tuple(want.shape), want.dtype, example.label, eager, lambda: raw(*args),
                lambda: overload(*args), lambda: launch(*args), _bytes_like(*example.moved_tensors(args, want)), own)


def _bytes_like(*tensors: torch.Tensor) -> torch.Tensor:
    """A buffer whose copy moves as many bytes as reading and writing ``tensors`` once."""
    moved = sum(t.numel() * t.element_size() for t in tensors)
    return torch.empty(moved // 8, dtype=torch.float32, device="cuda")


def _plain(fn):
    """``fn()`` with its kernels launched after the previous kernel ends (no programmatic
    dependent launch: nothing of the launch overlaps the kernel before)."""
    from sgdiff.kernels.triton.launch import plain_launches

    with plain_launches():
        return fn()


def measure(case: Case) -> dict:
    want = case.eager()
    got = case.sgdiff_raw()
    via_op = case.sgdiff_op()
    torch._dynamo.reset()  # each case's chain is its own compile, never a recompile of another's
    inductor_fn = torch.compile(case.eager)
    ind = inductor_fn()
    dst = torch.empty_like(case.copy_src)
    src_ints, dst_ints = _as_ints(case.copy_src), _as_ints(dst)
    nbytes = 2 * case.copy_src.numel() * case.copy_src.element_size()
    row = dict(
        op=case.op, shape=list(case.shape), dtype=str(case.dtype).removeprefix("torch."), note=case.note,
        bitexact=bool(torch.equal(got, want)), bitexact_via_op=bool(torch.equal(via_op, want)),
        mismatches=int((got != want).sum()),
        inductor_bitexact=bool(torch.equal(ind, want)),
        inductor_max_diff=float((ind.float() - want.float()).abs().max()),
        # Inductor's chain twice, each a graph of its own: how far one kernel's timings part (the noise floor)
        **gpu_times(dict(eager_us=case.eager, inductor_us=inductor_fn, inductor_again_us=inductor_fn,
                         sgdiff_us=case.sgdiff_raw,
                         sgdiff_plain_us=lambda: _plain(case.sgdiff_raw), copy_us=lambda: dst.copy_(case.copy_src),
                         copy_sm_us=lambda: torch.bitwise_or(src_ints, 0, out=dst_ints),
                         **({} if case.own_kernel is None else dict(kernel_us=case.own_kernel)))),
        **wall_us(dict(wall_eager_us=case.eager, wall_sgdiff_us=case.sgdiff_op, wall_sgdiff_raw_us=case.sgdiff_raw,
                       wall_sgdiff_launcher_us=case.sgdiff_launcher)),
        wall_sgdiff_via="call site",
    )
    row["copy_gbps"] = nbytes / _copy_us(row) / 1e3
    row["sgdiff_gbps"] = nbytes / _own_us(row) / 1e3
    return row


def _write_json(result: dict, out, name: str) -> str:
    """``result`` as ``out/<name>.json``; returns what a report says first of the run: its torch,
    triton and commit."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return f"torch {result['torch']}, triton {result['triton']}, commit {result['commit']}."


def _meta(device=None) -> dict:
    """The run's GPU (``cpu`` where ``device`` is given and not a CUDA device), torch, triton and commit."""
    import triton

    commit = os.environ.get("SGDIFF_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    if device is not None and torch.device(device).type != "cuda":
        gpu = "cpu"
    return dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, commit=commit or "unknown")


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _as_ints(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as integers of its element size: an elementwise op on them moves the bytes unchanged."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _copy_us(case: dict) -> float:
    """The copy that the bar is taken on: the faster of ``copy_`` (a memcpy node in the graph)
    and an elementwise kernel moving the same bytes on the SMs (``copy_sm_us``; runs before
    it was timed: the memcpy alone). A memcpy of 0.6-1 GB ran at 2.7 TB/s in some processes
    and at 4.2 in others on the H200; the kernel at 4.2 in both."""
    return min(case["copy_us"], case.get("copy_sm_us", float("inf")))


def _own_us(case: dict) -> float:
    """sgdiff's time that the copy bar is taken on: its own kernel's where the case times one (‡)."""
    return case.get("kernel_us", case["sgdiff_us"])


def _copy_ratio(case: dict) -> str:
    """sgdiff's time over a copy's, of its own kernel where the case times one (‡)."""
    ratio = f"{_own_us(case) / _copy_us(case):.2f}"
    return f"{ratio} ‡ ({case['kernel_us']:.1f})" if "kernel_us" in case else ratio


def write_report(result: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(result, indent=1))
    lines = [f"# sgdiff kernels on {result['gpu']}",
             f"torch {result['torch']}, triton {result['triton']}, commit {result['commit']}. "
             "GPU times in µs per call, the median of CUDA-graph replays that alternate between the ways, each "
             "after an untimed replay of its own (rows at 6b96321 and earlier: each way's replays in turn); "
             "wall = host time per call (the median of rounds that alternate between the ways; rows at fa815d7 "
             "and earlier: each way's rounds in turn), "
             "eager chain vs "
             "sgdiff as a compiled graph with static shapes calls it (a call site: an alignment lookup and a launch "
             "bound to the signature; † marks runs that timed the op launcher instead: a signature lookup and "
             "the launch) and through the registered op (torch.ops.sgdiff, dispatcher included). ‡: sgdiff/copy "
             "of sgdiff's own kernel alone (a convolution's epilogue on its output, in µs after the ratio); "
             "the other columns include the convolution. sgdiff's kernels are programmatic dependent launches on "
             "Hopper: a call's launch overlaps the end of the call before it (timed back to back: itself); "
             "'plain' times the same calls launched each after the last has ended, as eager's, Inductor's and "
             "the copy's are ('-': rows timed before c1ee777). copy: the faster of `copy_` (a memcpy in the graph) "
             "and an elementwise kernel moving the same bytes on the SMs, in the runs that timed both (`copy_sm_us` "
             "in kernels.json; before, the memcpy alone). 'Inductor again': the same compiled chain timed a second "
             "time, as a graph of its own, in the same replays: how far two timings of one kernel part ('-': rows "
             "timed before it was).", "",
             "| op | shape | dtype | case | bit-exact | sgdiff | sgdiff plain | eager | Inductor | Inductor again | "
             "copy | sgdiff/copy | wall sgdiff | wall sgdiff op | wall eager | " + run_header(result) + " |",
             "|" + " --- |" * 16]
    for c in result["cases"]:
        lines.append(f"| {c['op']} | {'×'.join(map(str, c['shape']))} | {c['dtype']} | {c['note']} | "
                     f"{'yes' if c['bitexact'] else 'NO (%d)' % c['mismatches']} | {c['sgdiff_us']:.1f} | "
                     f"{_us(c.get('sgdiff_plain_us'))} | {c['eager_us']:.1f} | {c['inductor_us']:.1f} | "
                     f"{_us(c.get('inductor_again_us'))} | {_copy_us(c):.1f} | "
                     f"{_copy_ratio(c)} | {c['wall_sgdiff_launcher_us']:.1f}{'' if c.get('wall_sgdiff_via') else ' †'} | "
                     f"{c['wall_sgdiff_us']:.1f} | {c['wall_eager_us']:.1f} | {run_label(c, result)} |")
    (out / "kernels.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cases = result["cases"]
        labels = [f"{c['op']}\n{'×'.join(map(str, c['shape']))} {c['dtype']}" for c in cases]
        fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.9), 4.5))
        width = 0.2
        ways = dict(eager=lambda c: c["eager_us"], inductor=lambda c: c["inductor_us"], sgdiff=lambda c: c["sgdiff_us"],
                    copy=_copy_us)
        for i, (label, us) in enumerate(ways.items()):
            ax.bar([j + i * width for j in range(len(cases))], [us(c) / _copy_us(c) for c in cases], width, label=label)
        ax.set_xticks([j + 1.5 * width for j in range(len(cases))], labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("GPU time / copy of the same bytes")
        ax.axhline(COPY_BAR, color="gray", ls=":", lw=1)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "kernels.png", dpi=110)
    except ImportError:
        pass


def merge_cases(old: dict, new: dict, key: Callable[[dict], tuple], rank: Callable[[tuple], int]) -> dict:
    """Results ``old`` with the cases of ``new`` (a run of some of them) in place of the same
    cases (``key``), each case tagged with the commit and the GPU it ran on, ordered by ``rank``
    (stable). Where the cases come from several GPUs, ``gpu`` names them all."""
    def tagged(c, run):
        return dict(c, commit=c.get("commit", run["commit"]), gpu=c.get("gpu", run.get("gpu")))

    cases = {key(c): tagged(c, old) for c in old["cases"]}
    cases.update({key(c): tagged(c, new) for c in new["cases"]})
    gpus = sorted({c["gpu"] for c in cases.values() if c["gpu"]})
    return dict(new, gpu=" / ".join(gpus) if gpus else new.get("gpu"), cases=[cases[k] for k in sorted(cases, key=rank)])


def run_header(result: dict) -> str:
    """The heading of a merged table's last column: :func:`run_label`'s."""
    return "commit, GPU" if " / " in (result.get("gpu") or "") else "commit"


def run_label(case: dict, result: dict) -> str:
    """A merged case's commit, and its GPU where the table's cases come from several
    (:func:`merge_cases`)."""
    commit = case.get("commit", result["commit"])[:7]
    if " / " not in (result.get("gpu") or ""):
        return commit
    return f"{commit}, {(case.get('gpu') or result['gpu']).removeprefix('NVIDIA ').split()[0]}"


def fold_runs(published: pathlib.Path, runs, merge: Callable[[dict, dict], dict], write: Callable) -> None:
    """Fold the result files ``runs`` (earliest first) into the results ``published`` (a JSON
    file; the first run where there is none yet) with ``merge``, and rewrite its report with
    ``write(results, folder)``."""
    if not published.exists():
        published.parent.mkdir(parents=True, exist_ok=True)
        published.write_text(pathlib.Path(runs[0]).read_text())
    merged = json.loads(published.read_text())
    for path in runs:
        merged = merge(merged, json.loads(pathlib.Path(path).read_text()))
    write(merged, published.parent)


def _case_key(case: dict) -> tuple:
    return case["op"], tuple(case["shape"]), case["dtype"], case["note"]


def merge_results(old: dict, new: dict) -> dict:
    """Kernel results: cases are (op, shape, dtype, note), in the registry's order of ops."""
    from sgdiff.kernels import registry

    order = {op.name: i for i, op in enumerate(registry.ops())}
    return merge_cases(old, new, _case_key, lambda k: order.get(k[0], len(order)))


def _noise_floor(cases: List[dict]) -> dict:
    """Over the runs that timed Inductor's chain twice (``inductor_again_us``): the median gap
    between its two timings, and in how many of those runs sgdiff was above Inductor by no more
    than that run's gap (a difference one kernel shows against itself orders nothing)."""
    timed = [c for c in cases if c.get("inductor_again_us") is not None]
    gaps = [abs(c["inductor_again_us"] - c["inductor_us"]) for c in timed]
    return dict(noise_runs=len(timed), noise_median_us=statistics.median(gaps) if gaps else None,
                within_noise=sum(c["sgdiff_us"] - c["inductor_us"] <= gap for c, gap in zip(timed, gaps)))


def across_runs(runs: List[dict]) -> List[dict]:
    """The cases that ran in more than one of ``runs`` (kernel results, in the first run's order
    of cases): each run's GPU times, their medians, in how many runs sgdiff took no longer than
    Inductor and no longer than 1.5 copies of the same bytes, the same for sgdiff launched
    plainly (``sgdiff_plain_us``) in the runs that timed it, and Inductor against itself
    (:func:`_noise_floor`). Where two kernels tie at a roofline, one run cannot order them;
    several can say how often each way comes out ahead, and by how much more than noise."""
    seen: Dict[tuple, List[dict]] = {}
    for run in runs:
        for case in run["cases"]:
            seen.setdefault(_case_key(case), []).append(dict(case, commit=case.get("commit", run["commit"])))
    rows = []
    for key, cases in seen.items():
        if len(cases) < 2:
            continue
        sgdiff = [c["sgdiff_us"] for c in cases]
        inductor = [c["inductor_us"] for c in cases]
        to_copy = [_own_us(c) / _copy_us(c) for c in cases]
        plain = [c for c in cases if c.get("sgdiff_plain_us") is not None]
        # a ‡ case's plain time includes its convolution: its copy ratio is its own kernel's
        plain_to_copy = [(c["sgdiff_plain_us"] - c["sgdiff_us"] + _own_us(c)) / _copy_us(c) for c in plain]
        rows.append(dict(op=key[0], shape=list(key[1]), dtype=key[2], note=key[3], commits=[c["commit"] for c in cases],
                         sgdiff_us=sgdiff, inductor_us=inductor,
                         sgdiff_median_us=statistics.median(sgdiff), inductor_median_us=statistics.median(inductor),
                         at_or_below_inductor=sum(s <= i for s, i in zip(sgdiff, inductor)),
                         copy_ratio_median=statistics.median(to_copy),
                         within_copy_bar=sum(r <= COPY_BAR for r in to_copy),
                         plain_runs=len(plain),
                         plain_median_us=statistics.median(c["sgdiff_plain_us"] for c in plain) if plain else None,
                         plain_at_or_below_inductor=sum(c["sgdiff_plain_us"] <= c["inductor_us"] for c in plain),
                         plain_copy_ratio_median=statistics.median(plain_to_copy) if plain else None,
                         plain_within_copy_bar=sum(r <= COPY_BAR for r in plain_to_copy),
                         **_noise_floor(cases)))
    return rows


def write_across_runs(runs: List[dict], out: pathlib.Path) -> None:
    """``kernels-across-runs.md`` in ``out``: :func:`across_runs` as a table."""
    rows = across_runs(runs)
    lines = ["# sgdiff kernels against Inductor and a copy across runs",
             f"{runs[0]['gpu']}, torch {runs[0]['torch']}, triton {runs[0]['triton']}. The cases that ran in more "
             "than one of the runs below, each run in a process of its own; GPU times in µs as in `kernels.md`. "
             "/copy: sgdiff's time over a copy of the same bytes, each run's ratio (‡ cases: their own kernel's), "
             f"then the median; ≤ {COPY_BAR}x copy: in how many runs. 'plain': the same calls launched each after "
             "the last has ended, in the runs that timed them. Inductor against itself: in the runs that timed its "
             "chain twice (each a graph of its own, in the same replays), the median gap between the two timings, "
             "and in how many of them sgdiff was above Inductor by no more than that run's gap.",
             "", "Runs: " + ", ".join(f"{run['commit']} ({len(run['cases'])} cases)" for run in runs), "",
             "| op | shape | dtype | case | commits | sgdiff / Inductor, each run | median sgdiff | median Inductor | "
             f"runs with sgdiff ≤ Inductor | median /copy | runs ≤ {COPY_BAR}x copy | median plain | "
             f"plain runs ≤ Inductor | median plain /copy | plain runs ≤ {COPY_BAR}x copy | "
             "Inductor against itself, median gap | runs sgdiff ≤ Inductor + gap |", "|" + " --- |" * 17]
    for r in rows:
        # three decimals: at a tie the count turns on differences that two would round away
        pairs = ", ".join(f"{s:.3f} / {i:.3f}" for s, i in zip(r["sgdiff_us"], r["inductor_us"]))
        n, p = len(r["sgdiff_us"]), r["plain_runs"]
        plain = (f"{r['plain_median_us']:.3f} | {r['plain_at_or_below_inductor']} of {p} | "
                 f"{r['plain_copy_ratio_median']:.3f} | {r['plain_within_copy_bar']} of {p}") if p else "- | - | - | -"
        q = r["noise_runs"]
        noise = f"{r['noise_median_us']:.3f} | {r['within_noise']} of {q}" if q else "- | -"
        lines.append(f"| {r['op']} | {'×'.join(map(str, r['shape']))} | {r['dtype']} | {r['note']} | "
                     f"{', '.join(r['commits'])} | {pairs} | {r['sgdiff_median_us']:.3f} | "
                     f"{r['inductor_median_us']:.3f} | {r['at_or_below_inductor']} of {n} | "
                     f"{r['copy_ratio_median']:.3f} | {r['within_copy_bar']} of {n} | {plain} | {noise} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels-across-runs.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--ops", default=None, help="comma-separated op names (default: every op with examples)")
    parser.add_argument("--quick", action="store_true", help="one example per op")
    parser.add_argument("--match", default=None, help="only the examples whose description holds this text")
    parser.add_argument("--merge", nargs="+", metavar="KERNELS_JSON",
                        help="no measuring: merge these results (earliest first) into --out's kernels.json")
    parser.add_argument("--across", nargs="+", metavar="KERNELS_JSON",
                        help="no measuring: compare sgdiff with Inductor and a copy over these runs (kernels-across-runs.md in --out)")
    args = parser.parse_args(argv)
    if args.across:
        write_across_runs([json.loads(pathlib.Path(p).read_text()) for p in args.across], pathlib.Path(args.out))
        return 0
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "kernels.json", args.merge, merge_results, write_report)
        return 0
    from tqdm import tqdm

    examples = list(bench_examples(args.ops.split(",") if args.ops else None, args.quick, args.match))
    rows = []
    meta = _meta()
    for i, (op, example) in enumerate(tqdm(examples, desc="kernels", file=sys.stdout)):
        rows.append(measure(make_case(op, example, seed=i)))
        torch.cuda.empty_cache()
        write_report(dict(meta, cases=rows), pathlib.Path(args.out))  # a cut-short run keeps its cases
        r = rows[-1]
        tqdm.write(f"{r['op']:<20} {str(r['shape']):<20} {r['dtype']:<9} exact={r['bitexact']} "
                   f"mism={r['mismatches']} sgdiff={r['sgdiff_us']:.1f} eager={r['eager_us']:.1f} "
                   f"ind={r['inductor_us']:.1f}/{r['inductor_again_us']:.1f} copy={_copy_us(r):.1f} "
                   f"wall={r['wall_sgdiff_us']:.1f}/"
                   f"{r['wall_eager_us']:.1f} launcher={r['wall_sgdiff_launcher_us']:.1f} raw={r['wall_sgdiff_raw_us']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
