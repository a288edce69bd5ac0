"""Profile bench: where a transformer step's device time goes, per quality tier, by kernel.

    python -m bench.profile [--models flux] [--tiers lossless,high] [--size full] [--calls 2]

Per model, in one process: the transformer compiled once with ``backend="sgdiff"`` and CUDA
graphs off (so that the profiler sees every kernel a step launches), run at each tier through
the per-call switch; after three warm-up calls a tier (compiling its variant, first sight of its
kernels), ``--calls`` calls under ``torch.profiler``, each kernel's device time summed by name and
divided by the calls. Kernels are put in categories by name (:func:`category`: GEMMs, FP8 GEMMs,
attention, sgdiff's Triton kernels, ATen's, memory operations). On the CPU, the CPU ops' own time
stands in (a test of the bench, not a figure). Writes profile.json and profile.md:
``{gpu, torch, triton, commit, cases: [{model, size, tier, calls, kernel_ms, categories: {name:
ms}, kernels: [{name, category, us, calls}]}]}`` (``us`` and ``calls`` a step; the 40 longest
kernels).
"""
from __future__ import annotations

import collections
import pathlib
import re
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _write_json  # noqa: E402
from bench.tiers import chosen_tiers, each_model, tier_arguments  # noqa: E402

KEPT = 40  # kernels a case lists

_CATEGORIES = (  # first match wins
    ("fp8 gemm", re.compile(r"qqtst|f8f8|e4m3.*gemm|gemm.*e4m3|scaled_mm", re.I)),
    ("attention", re.compile(r"sdpa|flash|fmha|attention|attn", re.I)),
    ("gemm", re.compile(r"^nvjet|gemm|cutlass|xmma|splitKreduce|^aten::(mm|addmm|bmm|linear)$", re.I)),
    ("sgdiff triton", re.compile(r"^_\w+_kernel$")),
    ("memory", re.compile(r"^Memset|^Memcpy|copy_kernel|CatArray|^aten::(copy_|cat|clone|contiguous)$", re.I)),
    ("aten", re.compile(r"at::native|^aten::")),
)


def category(name: str) -> str:
    """The category of a kernel (or, on the CPU, an op) by its name; ``other`` where none fits."""
    for label, pattern in _CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def _step_kernels(prof, calls: int, cuda: bool) -> dict:
    """``{name: [us, launches]}`` a call: CUDA kernels' device time, or CPU ops' own time."""
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time_total
        elif not cuda and e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::"):
            us = e.self_cpu_time_total
        else:
            continue
        t = totals[e.name]
        t[0] += us / calls
        t[1] += 1 / calls
    return totals


def run_model(name: str, size: str, device: torch.device, dtype, tiers, calls: int) -> list:
    import sgdiff
    from sgdiff import zoo
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options

    torch.manual_seed(0)
    model, kwargs = zoo.build(name, size, dtype=dtype, device=device)
    compiled = torch.compile(model, backend=SgdiffBackend(Options(cudagraphs=False)))
    cuda = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    cases = []
    with torch.no_grad():
        for tier in tiers:
            with sgdiff.quality(tier):
                for _ in range(3):
                    compiled(**kwargs)
                if cuda:
                    torch.cuda.synchronize(device)
                with torch.profiler.profile(activities=[activity]) as prof:
                    for _ in range(calls):
                        compiled(**kwargs)
                    if cuda:
                        torch.cuda.synchronize(device)
            totals = _step_kernels(prof, calls, cuda)
            rows = sorted(totals.items(), key=lambda kv: -kv[1][0])
            categories = collections.Counter()
            for kernel, (us, _) in rows:
                categories[category(kernel)] += us / 1e3
            cases.append(dict(model=name, size=size, tier=tier, calls=calls,
                              kernel_ms=sum(us for us, _ in totals.values()) / 1e3,
                              categories=dict(categories.most_common()),
                              kernels=[dict(name=k, category=category(k), us=us, calls=n) for k, (us, n) in rows[:KEPT]]))
    return cases


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "profile")
    lines = [f"# Where a step's time goes, by kernel ({result['gpu']})",
             f"{versions} Device time a step (CUDA graphs off), summed by kernel name.", ""]
    for c in result["cases"]:
        lines += [f"## {c['model']} ({c['size']}), {c['tier']}: {c['kernel_ms']:.2f} ms of kernels a step", "",
                  "| category | ms |", "| --- | --- |",
                  *[f"| {label} | {ms:.2f} |" for label, ms in c["categories"].items()], "",
                  "| kernel | category | µs a step | launches a step |", "| --- | --- | --- | --- |",
                  *[f"| `{k['name'][:100]}` | {k['category']} | {k['us']:.1f} | {k['calls']:g} |" for k in c["kernels"]],
                  ""]
    (out / "profile.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = tier_arguments(__doc__.splitlines()[0], "flux", "lossless,high")
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args(argv)
    tiers = chosen_tiers(parser, args.tiers)
    return each_model(args, lambda name: run_model(name, args.size, torch.device(args.device),
                                                   getattr(torch, args.dtype), tiers, args.calls), write_report)


if __name__ == "__main__":
    raise SystemExit(main())
