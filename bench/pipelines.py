"""Pipeline bench: whole diffusers pipelines (random weights, prompt embeddings given), eager
against Inductor against sgdiff, and their VAE decodes.

    python -m bench.pipelines [--pipelines flux,wan,sana] [--size full] [--steps N] [--warmup N] [--out bench/results]

Per pipeline, each variant on a pipeline built anew from the same seed: eager; Inductor
(``torch.compile`` on the denoiser and on ``vae.decode``); sgdiff lossless
(``sgdiff.optimize(pipe)``). A first call compiles and ``--warmup`` more run untimed (a graph
of a new shape is captured at its third call, and a VAE decoding frame by frame compiles some
frames again on later calls, until dynamo's recompile limit: the steady state a user's second
and later calls see); the next is timed end to end (seconds, synchronized), then the VAE decode alone on the latents the eager run decoded (ms, CUDA events,
median of ``--repeats``; wall clock on the CPU); peak memory of the timed call; what the pipeline holds between
calls and the most its decode allocates above that (``held_gib``, ``vae_peak_gib``); whether the output tensor
(and the decode's) is ``torch.equal`` to eager's. Writes pipelines.json and pipelines.md: ``{gpu, torch,
triton, commit, cases: [{pipeline, steps, eager_s, inductor_s, sgdiff_s, sgdiff_equal,
vae_eager_ms, vae_inductor_ms, vae_sgdiff_ms, vae_sgdiff_equal, peak_gib: {variant: GiB}, held_gib: {...},
vae_peak_gib: {...}}]}``.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.kernels import _meta, _write_json, fold_runs, merge_cases, run_header, run_label  # noqa: E402
from bench.timing import call_ms  # noqa: E402

VARIANTS = ("eager", "inductor", "sgdiff")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _compiled(variant: str, pipe):
    import sgdiff

    if variant == "inductor":
        pipe.transformer = torch.compile(pipe.transformer)
        pipe.vae.decode = torch.compile(pipe.vae.decode)
    elif variant == "sgdiff":
        sgdiff.optimize(pipe)
    return pipe


def _output(result) -> torch.Tensor:
    return result.images if hasattr(result, "images") else result.frames


def _decode_ms(pipe, latents, device: torch.device, repeats: int):
    """The decode's output, its median time in ms and ``(held, peak)``: the GiB allocated before
    the first decode (what the pipeline holds between calls: weights, kept graphs' memory) and
    the most the decode allocated above it (None off the GPU)."""
    with torch.no_grad():
        memory = None
        if device.type == "cuda":
            _sync(device)
            held = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        out = pipe.vae.decode(latents, return_dict=False)[0]
        if device.type == "cuda":
            _sync(device)
            memory = held / 2**30, (torch.cuda.max_memory_allocated(device) - held) / 2**30
        times = [call_ms(lambda: pipe.vae.decode(latents, return_dict=False), device) for _ in range(repeats)]
    return out, statistics.median(times), memory


def run_pipeline(name: str, size: str, device: torch.device, dtype, steps, repeats: int,
                 variants=VARIANTS, warmup: int = 2) -> dict:
    from sgdiff import zoo

    row = dict(pipeline=name, size=size)
    want = want_decode = latents = None
    for variant in ("eager", *[v for v in variants if v != "eager"]):
        torch._dynamo.reset()
        pipe, call = zoo.build_pipeline(name, size, dtype=dtype, device=device)
        if steps:
            call["num_inference_steps"] = steps
        row["steps"], row["warmup_calls"] = call["num_inference_steps"], warmup
        if latents is None:  # the latents the eager run decodes, for the decode's own timing
            decode = pipe.vae.decode
            seen = []
            pipe.vae.decode = lambda z, *a, **k: (seen.append(z), decode(z, *a, **k))[1]
        pipe = _compiled(variant, pipe)
        with torch.no_grad():
            for _ in range(1 + (warmup if variant != "eager" else 0)):  # compiles, then warms up
                _output(pipe(**dict(call, generator=torch.Generator().manual_seed(0))))
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            _sync(device)
            t0 = time.perf_counter()
            out = _output(pipe(**dict(call, generator=torch.Generator().manual_seed(0))))
            _sync(device)
        row[f"{variant}_s"] = time.perf_counter() - t0
        if device.type == "cuda":
            row.setdefault("peak_gib", {})[variant] = torch.cuda.max_memory_allocated() / 2**30
        if latents is None:
            latents = seen[-1]
            del pipe.vae.decode  # the instance's wrapper: the class's decode again
        decoded, row[f"vae_{variant}_ms"], memory = _decode_ms(pipe, latents, device, repeats)
        if memory is not None:
            row.setdefault("held_gib", {})[variant], row.setdefault("vae_peak_gib", {})[variant] = memory
        if variant == "eager":
            want, want_decode = out, decoded
        else:
            row[f"{variant}_equal"] = torch.equal(out, want)
            row[f"vae_{variant}_equal"] = torch.equal(decoded, want_decode)
        del pipe, out, decoded
    torch._dynamo.reset()
    return row


def write_report(result: dict, out: pathlib.Path) -> None:
    versions = _write_json(result, out, "pipelines")
    lines = [f"# Whole pipelines ({result['gpu']})",
             f"{versions} End-to-end seconds of a "
             "call after a compiling one and the warm-up calls (untimed; eager has none); the VAE decode alone in ms "
             "(median); equal: torch.equal to eager's.", "",
             "| pipeline | steps | warm-up calls | eager s | Inductor s | sgdiff s | sgdiff equal | VAE eager ms | "
             "VAE Inductor ms | VAE sgdiff ms | VAE sgdiff equal | peak GiB (eager / Inductor / sgdiff) | "
             "decode's peak above what is held, GiB | " + run_header(result) + " |",
             "|" + " --- |" * 14]
    def num(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    for c in result["cases"]:
        peak, vae_peak = c.get("peak_gib", {}), c.get("vae_peak_gib", {})
        lines.append(f"| {c['pipeline']} ({c['size']}) | {c['steps']} | {c.get('warmup_calls', 0)} | "
                     f"{num(c.get('eager_s'), 2)} | "
                     f"{num(c.get('inductor_s'), 2)} | {num(c.get('sgdiff_s'), 2)} | {c.get('sgdiff_equal', '-')} | "
                     f"{num(c.get('vae_eager_ms'), 1)} | {num(c.get('vae_inductor_ms'), 1)} | "
                     f"{num(c.get('vae_sgdiff_ms'), 1)} | {c.get('vae_sgdiff_equal', '-')} | "
                     + (" / ".join(f"{peak[v]:.1f}" for v in VARIANTS if v in peak) or "-") + " | "
                     + (" / ".join(f"{vae_peak[v]:.2f}" for v in VARIANTS if v in vae_peak) or "-")
                     + f" | {run_label(c, result)} |")
    lines += [""] + [f"- {c['pipeline']} ({c['size']}): {c['note']}" for c in result["cases"] if c.get("note")]
    (out / "pipelines.md").write_text("\n".join(lines).rstrip() + "\n")


def merge_runs(old: dict, new: dict) -> dict:
    """``old`` with the pipelines ``new`` ran in their place; where ``new`` ran some variants
    only (a run split over calls), its figures join the same pipeline's of ``old``, which must
    be of the same GPU, steps and warm-up calls."""
    def key(c):
        return c["pipeline"], c["size"]

    same = {key(c): c for c in old["cases"] if c.get("gpu", old.get("gpu")) == new.get("gpu")}
    for c in new["cases"]:
        base = same.get(key(c))
        if base is not None and (base["steps"], base.get("warmup_calls")) == (c["steps"], c.get("warmup_calls")) \
                and not {"inductor_s", "sgdiff_s"} <= c.keys():
            c.update({k: v for k, v in base.items() if k not in c and k not in ("commit", "gpu", "note")},
                     **{k: {**v, **c.get(k, {})} for k, v in base.items() if isinstance(v, dict)})
    order = ["flux", "wan", "sana"]
    return merge_cases(old, new, key=key, rank=lambda k: order.index(k[0]) if k[0] in order else len(order))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="flux,wan,sana")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=0, help="denoising steps (0: the pipeline's own)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the compiling one")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--merge", nargs="+", metavar="PIPELINES_JSON",
                        help="no measuring: fold these results (earliest first) into --out's pipelines.json")
    args = parser.parse_args(argv)
    if args.merge:
        fold_runs(pathlib.Path(args.out) / "pipelines.json", args.merge, merge_runs, write_report)
        return 0
    meta = _meta()
    if args.device != "cuda":
        meta["gpu"] = "cpu"
    cases = []
    for name in args.pipelines.split(","):
        cases.append(run_pipeline(name, args.size, torch.device(args.device), getattr(torch, args.dtype), args.steps,
                                  args.repeats, args.variants.split(","), args.warmup))
        write_report(dict(meta, cases=cases), pathlib.Path(args.out))  # a run cut short keeps what it measured
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
