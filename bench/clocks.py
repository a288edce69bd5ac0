"""Clock bench: what bounds a compiled step — launch gaps, or the GPU's power limit.

    python -m bench.clocks [--models flux] [--tiers lossless] [--size full] [--repeats 10]

Per model and tier, in one process: the transformer compiled with ``backend="sgdiff"`` as a user
compiles it (CUDA graphs on), three warm-up calls, then ``--repeats`` steps timed
(bench/models.py's ``step_times``) while a thread samples the GPU's SM clock, its power draw and
the clock-throttle reasons through NVML every 10 ms; then ``--profiled`` single steps, each from
an idle GPU, under ``torch.profiler``: the kernels' span (first start to last end), the time
some kernel runs (the union of their intervals), and the gaps between them, the longest listed.
A step whose gaps are a few percent of its span is bound by its kernels; if the clock then sits
below its maximum with the power-cap reason set, it is bound by the energy its kernels spend,
and only less work or cheaper work makes it faster. On the CPU the outermost CPU ops stand in
for kernels and no clock is read (a test of the bench, not a figure). Writes clocks.json and
clocks.md: ``{gpu, torch, triton, commit, cases: [{model, size, tier, step_ms, pipelined_ms,
sm_mhz: {min, median, max}, sm_mhz_limit, power_w: {min, median, max}, power_limit_w,
throttle_reasons: {reason: share of the samples that had it}, profiled: [{kernels, span_ms,
busy_ms, gap_ms, gaps_over_20us, longest_gaps: [[us, next kernel]]}]}]}``.
"""
from __future__ import annotations

import logging
import pathlib
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _write_json  # noqa: E402
from bench.models import step_times  # noqa: E402
from bench.tiers import chosen_tiers, each_model, tier_arguments  # noqa: E402

log = logging.getLogger("sgdiff")

# NVML's clocks-event reasons (nvmlClocksEventReasons*), the ones a step can meet
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
           0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake"}


class Sampler:
    """NVML's SM clock (MHz), power draw (W) and throttle reasons of ``device``, every
    ``period`` s while the ``with`` block runs; nothing where NVML cannot be read."""

    def __init__(self, device: torch.device, period: float = 0.01):
        self.device, self.period, self.samples, self.limits = device, period, [], {}
        self._stop, self._thread, self._handle = threading.Event(), None, None

    def __enter__(self):
        if self.device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device.index or 0)
                self.limits = dict(sm_mhz_limit=pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM),
                                   power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3)
            except Exception as exc:  # no NVML (nvidia-ml-py) or no permission: time without clocks
                log.warning("bench.clocks: NVML unreadable (%s: %s); no clocks sampled", type(exc).__name__, exc)
                self._handle = None
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        nvml, h = self._nvml, self._handle
        # NVML's newer name for the reasons first, the older one where only it exists
        reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        while not self._stop.is_set():
            self.samples.append((nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                                 nvml.nvmlDeviceGetPowerUsage(h) / 1e3, reasons(h)))
            time.sleep(self.period)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        spread = lambda xs: dict(min=min(xs), median=statistics.median(xs), max=max(xs))  # noqa: E731
        share = {name: sum(bool(r & bit) for _, _, r in self.samples) / len(self.samples)
                 for bit, name in REASONS.items()}
        return dict(self.limits, sm_mhz=spread([s[0] for s in self.samples]),
                    power_w=spread([s[1] for s in self.samples]),
                    throttle_reasons={name: round(f, 3) for name, f in share.items() if f})


def gaps(intervals, longest: int = 8) -> dict:
    """Span, busy time (the union of ``(start_us, end_us, name)`` intervals) and the gaps between
    them; the ``longest`` gaps as ``[us, the name of what ran after]``."""
    intervals = sorted(intervals)
    if not intervals:
        return dict(kernels=0, span_ms=0.0, busy_ms=0.0, gap_ms=0.0, gaps_over_20us=0, longest_gaps=[])
    busy, found = 0.0, []
    start, end = intervals[0][0], intervals[0][1]
    for s, e, name in intervals[1:]:
        if s > end:
            busy += end - start
            found.append((s - end, name))
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    span = max(e for _, e, _ in intervals) - intervals[0][0]
    found.sort(key=lambda g: -g[0])
    return dict(kernels=len(intervals), span_ms=span / 1e3, busy_ms=busy / 1e3,
                gap_ms=sum(g for g, _ in found) / 1e3, gaps_over_20us=sum(g > 20 for g, _ in found),
                longest_gaps=[[round(g, 1), name[:80]] for g, name in found[:longest]])


def _profiled_step(fn, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    if cuda:
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[activity]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    wanted = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    return gaps([(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == wanted and e.time_range.elapsed_us() > 0
                 and (cuda or ("::" in e.name and "::" not in getattr(e.cpu_parent, "name", "")))])


def run_model(name: str, size: str, device: torch.device, dtype, tiers, repeats: int, profiled: int) -> list:
    import sgdiff
    from sgdiff import zoo

    torch.manual_seed(0)
    model, kwargs = zoo.build(name, size, dtype=dtype, device=device)
    compiled = torch.compile(model, backend="sgdiff")
    cases = []
    with torch.no_grad():
        for tier in tiers:
            step = lambda: compiled(**kwargs)  # noqa: E731
            with sgdiff.quality(tier):
                for _ in range(3):
                    step()
                with Sampler(device) as sampler:
                    times = step_times(step, device, repeats)
                runs = [_profiled_step(step, device) for _ in range(profiled)]
            cases.append(dict(model=name, size=size, tier=tier, step_ms=times["ms"],
                              pipelined_ms=times["pipelined_ms"], **sampler.summary(), profiled=runs))
    return cases


def _reasons(found) -> str:
    """``power cap 98%, ...`` (a list from a run that kept no shares: the reasons alone)."""
    if not found:
        return "—"
    if isinstance(found, dict):
        return ", ".join(f"{name} {share:.0%}" for name, share in found.items())
    return ", ".join(found) + " (some samples)"


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "clocks")
    lines = [f"# What bounds a compiled step ({result['gpu']})",
             f"{versions} Step time (CUDA events, CUDA graphs on); the SM clock and power while stepping "
             "(NVML, every 10 ms); for single profiled steps from an idle GPU, the kernels' span, the time "
             "some kernel runs, and the gaps between kernels.", "",
             "| model | tier | step ms | pipelined ms | SM MHz (min-max) | power W (min-max) | throttled by (share of samples) "
             "| kernels | span ms | busy ms | gaps ms | gaps > 20 µs |",
             "| --- " * 12 + "|"]
    for c in result["cases"]:
        clock, power = c.get("sm_mhz"), c.get("power_w")
        clock_cell = (f"{clock['median']:.0f} ({clock['min']:.0f}-{clock['max']:.0f}) of {c['sm_mhz_limit']}"
                      if clock else "—")
        power_cell = (f"{power['median']:.0f} ({power['min']:.0f}-{power['max']:.0f}) of {c['power_limit_w']:.0f}"
                      if power else "—")
        for p in c["profiled"]:
            lines.append(f"| {c['model']} ({c['size']}) | {c['tier']} | {c['step_ms']:.2f} | {c['pipelined_ms']:.2f} "
                         f"| {clock_cell} | {power_cell} | {_reasons(c.get('throttle_reasons'))} "
                         f"| {p['kernels']} | {p['span_ms']:.2f} | {p['busy_ms']:.2f} | {p['gap_ms']:.2f} "
                         f"| {p['gaps_over_20us']} |")
    (out / "clocks.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = tier_arguments(__doc__.splitlines()[0], "flux", "lossless")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--profiled", type=int, default=2)
    args = parser.parse_args(argv)
    tiers = chosen_tiers(parser, args.tiers)
    return each_model(args, lambda name: run_model(name, args.size, torch.device(args.device),
                                                   getattr(torch, args.dtype), tiers, args.repeats,
                                                   args.profiled), write_report)


if __name__ == "__main__":
    raise SystemExit(main())
