"""GEMM bench: every large GEMM shape of Flux.1-dev, Sana 1.6B and Wan 2.1 1.3B and 14B, with its epilogue
(and Flux.2's SwiGLU feed-forward).

Per case, in one process, GPU time from CUDA-graph replays alternating between (bench/timing.py):
cuBLAS (``F.linear``), sgdiff's GEMM alone (the best configuration of every implementation that
takes the case: the Triton GEMM's, and on Hopper with ``sgdiff[gemm]`` the CuTe DSL one's), the
fused op (GEMM with the epilogue, same candidates), the unfused pair (cuBLAS + the chain's kernel:
ATen's activation, sgdiff's residual_gate kernel, its gelu_tanh_cat for a GELU stored into a cat,
or its silu_mul for a SwiGLU), whether every configuration gave eager's bits, which one was
fastest, and the path first-sight tuning chose. Writes bench/results/gemm.{json,md,png}
(gemm-sweep.* with --sweep).

    python -m bench.gemm [--out bench/results] [--models flux,sana,wan,wan14b,flux2] [--sweep] [--jobs 12]

``--sweep`` times every tile configuration of ``gemm.SWEEP`` (what picked the ones first sight
times); ``--jobs`` compiles the kernels of each case in worker processes first (Triton's cache
then serves the timing process).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch
import torch.nn.functional as F

from bench.timing import gpu_times

# (model, site, M, K, N, epilogue): epilogue none | gelu_tanh | gelu_tanh_cat (stored into a cat after
# attention's 3072 columns) | residual | cat_residual | swiglu (N: the weight's rows, both halves)
CASES = [
    ("flux", "double img to_q/k/v", 4096, 3072, 3072, "none"),
    ("flux", "double img to_out + gate", 4096, 3072, 3072, "residual"),
    ("flux", "double img ff up + gelu", 4096, 3072, 12288, "gelu_tanh"),
    ("flux", "double img ff down + gate", 4096, 12288, 3072, "residual"),
    ("flux", "double txt ff up + gelu", 512, 3072, 12288, "gelu_tanh"),
    ("flux", "double txt ff down + gate", 512, 12288, 3072, "residual"),
    ("flux", "single to_q/k/v", 4608, 3072, 3072, "none"),
    ("flux", "single proj_mlp + gelu", 4608, 3072, 12288, "gelu_tanh"),
    ("flux", "single proj_mlp + gelu into the cat", 4608, 3072, 12288, "gelu_tanh_cat"),
    ("flux", "single proj_out(cat) + gate", 4608, 15360, 3072, "cat_residual"),
    ("sana", "to_q/k/v", 2048, 2240, 2240, "none"),
    ("sana", "to_out + gate", 2048, 2240, 2240, "residual"),
    ("wan", "self-attn q/k/v", 32760, 1536, 1536, "none"),
    ("wan", "ffn up + gelu", 32760, 1536, 8960, "gelu_tanh"),
    ("wan", "ffn down + gate (fp32)", 32760, 8960, 1536, "residual"),
    ("wan14b", "self-attn q/k/v", 32760, 5120, 5120, "none"),
    ("wan14b", "ffn up + gelu", 32760, 5120, 13824, "gelu_tanh"),
    ("wan14b", "ffn down + gate (fp32)", 32760, 13824, 5120, "residual"),
    ("flux2", "single ff in + swiglu (gate first)", 4608, 6144, 36864, "swiglu"),
]


def _operands(model, M, K, N, epilogue, g):
    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)
    K1 = 3072 if epilogue == "cat_residual" else K
    x = randn(1, M, K1)
    x2 = randn(1, M, K - K1) if epilogue == "cat_residual" else None
    w, b = randn(N, K, scale=K ** -0.5), (None if epilogue == "swiglu" else randn(N))  # Flux.2: no bias
    fp32 = epilogue == "residual" and model.startswith("wan")  # Wan: fp32 gate, bf16 stream cast back
    residual = randn(1, M, N)
    gate = randn(1, 6, N, dtype=torch.float32 if fp32 else torch.bfloat16)[:, 2:3]
    return x, x2, w, b, residual, gate, (torch.bfloat16 if fp32 else None)


def _use_candidates(sweep: bool) -> None:
    """The configurations first sight and this bench time: each GEMM's sweep, or its own choice."""
    from sgdiff.kernels.triton import gemm
    gemm.candidates.append(gemm.SWEEP if sweep else None)
    try:
        from sgdiff.kernels.cute import gemm as cute_gemm
    except ImportError:  # no sgdiff[gemm] here
        return
    cute_gemm.candidates.append(cute_gemm.SWEEP if sweep else None)


def _compile_case(case, sweep: bool) -> str:
    """Run every configuration of a case once (a worker process: Triton compiles and caches)."""
    _use_candidates(sweep)
    g = torch.Generator(device="cuda").manual_seed(0)
    run_case(*case, g, time_it=False)
    return case[1]


def precompile(cases, sweep: bool, jobs: int) -> None:
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for site in pool.map(_compile_case, cases, [sweep] * len(cases)):
            print(f"  compiled: {site}", flush=True)


def implementations(op: str, args: tuple) -> list:
    """``(label, fn)`` of every configuration of every implementation of ``op`` that takes
    ``args`` here (labels ``"<backend> <configuration>"``); one that cannot load (CuTe's without
    ``sgdiff[gemm]``) is left out with a line."""
    from sgdiff.kernels import registry

    x = args[0]
    capability = torch.cuda.get_device_capability(x.device) if x.is_cuda else None
    found = []
    for spec in registry.kernel_specs(op):
        if spec.backend == "reference" or not spec.supports(x.device.type, str(x.dtype).removeprefix("torch."),
                                                            capability):
            continue
        try:
            impl = spec.load()
        except ImportError as exc:
            print(f"  {op} {spec.backend}: not installed ({exc})", flush=True)
            continue
        if impl.variants is None or (impl.supports is not None and not impl.supports(*args)):
            continue
        found += [(f"{spec.backend} {label}", fn) for label, fn in impl.variants(*args) if not label.startswith("cublas")]
    return found


def run_case(model, site, M, K, N, epilogue, g, time_it: bool = True, calls: int = 20, replays: int = 20):
    from sgdiff.kernels import dispatch, registry
    x, x2, w, b, residual, gate, out_dtype = _operands(model, M, K, N, epilogue, g)
    xs = x if x2 is None else torch.cat([x, x2], -1)
    plain_args = (x, w, b, x2)
    cublas = lambda: F.linear(xs, w, b)  # noqa: E731
    want_plain = cublas()
    mismatched = []  # configurations whose bits differ from eager's
    configs = {}
    for label, fn in implementations("linear", plain_args):
        try:
            if not torch.equal(fn(*plain_args), want_plain):
                mismatched.append(f"plain {label}")
            configs[label] = (lambda fn=fn: fn(*plain_args))
        except Exception as exc:  # a config that does not compile here
            print(f"  {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    if epilogue == "none":
        op, args = "linear", plain_args
        unfused = cublas
    elif epilogue == "gelu_tanh":
        op, args = "linear_act", (x, w, b, "gelu_tanh")
        unfused = lambda: F.gelu(F.linear(xs, w, b), approximate="tanh")  # noqa: E731
    elif epilogue == "gelu_tanh_cat":  # Flux single blocks: attention's [1, 24, M, 128] output laid out [1, M, 3072]
        head = torch.randn(1, 24, M, 128, device="cuda", generator=g).to(x.dtype).transpose(1, 2).flatten(2, 3)
        op, args = "linear_act_cat", (head, x, w, b, "gelu_tanh")
        unfused = lambda: dispatch.run("gelu_tanh_cat", head, F.linear(xs, w, b))  # noqa: E731
    elif epilogue == "swiglu":
        op, args = "linear_glu", (x, w, b, True, False)
        unfused = lambda: dispatch.run("silu_mul", *F.linear(xs, w, b).chunk(2, dim=-1), False)  # noqa: E731
    else:
        op, args = "linear_residual_gate", (x, w, b, residual, gate, "plain", out_dtype, x2)
        unfused = lambda: dispatch.run("residual_gate", residual, gate, F.linear(xs, w, b), "plain", True,  # noqa: E731
                                       None, None, out_dtype)
    want = dispatch.reference(op)(*args)
    fused = {}
    # none: the plain GEMM; a cuBLAS-led variant (the SwiGLU's unfused candidate) is not a fused one
    for label, fn in (implementations(op, args) if epilogue != "none" else ()):
        try:
            if not torch.equal(fn(*args), want):
                mismatched.append(f"fused {label}")
            fused[label] = (lambda fn=fn: fn(*args))
        except Exception as exc:
            print(f"  fused {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    if not torch.equal(unfused(), want):
        mismatched.append("unfused")
    if not time_it:
        return None
    times = gpu_times({"cublas": cublas, "unfused": unfused, **{f"plain {k}": v for k, v in configs.items()},
                       **{f"fused {k}": v for k, v in fused.items()}}, calls, replays)
    plain_best = min((k for k in times if k.startswith("plain ")), key=times.get)
    fused_best = min((k for k in times if k.startswith("fused ")), key=times.get, default=plain_best)
    sgdiff_us, fused_us = times[plain_best], times[fused_best]
    dispatch.reset()
    op_out = registry.op_def(op).load()(*args)  # first sight: verifies, times, settles
    if not torch.equal(op_out, want):
        mismatched.append("op")
    bitexact = not mismatched
    chosen = next((v[0] for (o, _), v in dispatch.tuned_choices().items() if o == op), "?")
    flop = 2 * M * N * K
    row = dict(model=model, site=site, M=M, K=K, N=N, epilogue=epilogue, bitexact=bool(bitexact),
               cublas_us=round(times["cublas"], 2), sgdiff_us=round(sgdiff_us, 2), fused_us=round(fused_us, 2),
               unfused_us=round(times["unfused"], 2), chosen=chosen, mismatched=mismatched,
               plain_best=plain_best.removeprefix("plain "), fused_best=fused_best.split(" ", 1)[1],
               cublas_tflops=round(flop / times["cublas"] / 1e6, 1), sgdiff_tflops=round(flop / sgdiff_us / 1e6, 1),
               per_config_us={k: round(v, 2) for k, v in times.items()})
    print(json.dumps(row), flush=True)
    return row


def write_md(result, out: pathlib.Path, name: str = "gemm"):
    lines = [f"# GEMMs at cuBLAS's bits ({result['gpu']}, torch {result['torch']}, triton {result['triton']}, "
             f"commit {result['commit']})", "",
             "GPU µs per call from CUDA-graph replays, alternating in one process. plain: sgdiff's GEMM alone "
             "(best config); fused: with the epilogue; unfused: cuBLAS + the chain's kernel; chosen: what "
             "first-sight tuning of the op kept.", "",
             "| model | site | M | K | N | epilogue | bitexact | cuBLAS | plain | plain/cuBLAS | fused | unfused | "
             "fused/unfused | fastest plain; fused | chosen |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in result["cases"]:
        lines.append(f"| {c['model']} | {c['site']} | {c['M']} | {c['K']} | {c['N']} | {c['epilogue']} | "
                     f"{'yes' if c['bitexact'] else 'NO'} | {c['cublas_us']} | {c['sgdiff_us']} | "
                     f"{c['sgdiff_us'] / c['cublas_us']:.3f} | {c['fused_us']} | {c['unfused_us']} | "
                     f"{c['fused_us'] / c['unfused_us']:.3f} | {c.get('plain_best', '?')}; {c.get('fused_best', '?')} | "
                     f"{c['chosen']} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    write_png(result, out / f"{name}.png")


def write_png(result, path: pathlib.Path) -> None:
    """Each case's GPU time over cuBLAS's: sgdiff's GEMM alone, fused with the chain, and cuBLAS +
    the chain's kernel (the pair the fused GEMM must beat)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cases = result["cases"]
    labels = [f"{c['model']} {c['site']}\n{c['M']}x{c['K']}x{c['N']}" for c in cases]
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.8), 4.5))
    ways = {"sgdiff plain": "sgdiff_us", "sgdiff fused": "fused_us", "cuBLAS + chain": "unfused_us"}
    width = 0.25
    for i, (label, key) in enumerate(ways.items()):
        ax.bar([j + i * width for j in range(len(cases))], [c[key] / c["cublas_us"] for c in cases], width, label=label)
    ax.set_xticks([j + width for j in range(len(cases))], labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GPU time / cuBLAS's GEMM alone")
    ax.axhline(1.0, color="gray", ls=":", lw=1)
    ax.set_title(f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, commit {result['commit']}",
                 fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--models", default="flux,sana,wan,wan14b,flux2")
    parser.add_argument("--sweep", action="store_true", help="time every configuration of gemm.SWEEP")
    parser.add_argument("--jobs", type=int, default=0, help="compile in this many worker processes first")
    a = parser.parse_args(argv)
    import triton
    chosen = [c for c in CASES if c[0] in a.models.split(",")]
    if a.jobs:
        precompile(chosen, a.sweep, a.jobs)
    _use_candidates(a.sweep)
    g = torch.Generator(device="cuda").manual_seed(0)
    timing = dict(calls=10, replays=10) if a.sweep else {}
    cases = [run_case(*c, g, **timing) for c in chosen]
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  commit=os.environ.get("SGDIFF_COMMIT", "unknown"), sweep=a.sweep, cases=cases)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "gemm-sweep" if a.sweep else "gemm"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    write_md(result, out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
