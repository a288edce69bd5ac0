"""Compile a diffusers DiT (random weights; Flux unless told) with sgdiff and show what it did.

    python -m sgdiff demo [--model flux] [--size small] [--dtype bfloat16] [--quality lossless]
"""
from __future__ import annotations

import argparse
import logging
import time

import torch


def _time(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of one call in ms (synchronized on CUDA)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _count(n: int) -> str:
    """A parameter count a person reads: 12.0 B, 37.4 M, 81.9 k, 512."""
    for scale, unit in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def main(argv=None) -> int:
    import sgdiff
    from sgdiff import zoo

    parser = argparse.ArgumentParser(prog="python -m sgdiff demo", description=__doc__.splitlines()[0])
    models = ", ".join(f"{name} ({case.doc}: {', '.join(case.sizes)})" for name, case in sorted(zoo.MODELS.items()))
    parser.add_argument("--model", default="flux", choices=sorted(zoo.MODELS), help=f"one of: {models}")
    parser.add_argument("--size", default=None, help="a size the model comes in (above); default: small where it "
                        "has one, else tiny")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--quality", default="lossless", choices=[t.value for t in sgdiff.Tier])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    sizes = zoo.MODELS[args.model].sizes
    size = args.size or ("small" if "small" in sizes else "tiny")
    if size not in sizes:
        parser.error(f"--size: {args.model} comes in {', '.join(sizes)}, not {size!r}")

    logging.basicConfig(format="%(message)s")
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # the demo casts random-weight models on purpose
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    model, kwargs = zoo.build(args.model, size, dtype=dtype, device=device)
    params = sum(p.numel() for p in model.parameters())
    layers = {k: v for k, v in model.config.items() if k.startswith("num_") and k.endswith("layers")}
    print(f"{zoo.MODELS[args.model].doc} {layers}: {size} config, {_count(params)} parameters, "
          f"random weights, {dtype} on {device}")

    report = sgdiff.explain(model, **kwargs, quality=args.quality)
    print(report)

    compiled = torch.compile(model, backend="sgdiff", options={"quality": args.quality})
    with torch.no_grad():
        eager_out = model(**kwargs)[0]
        t0 = time.perf_counter()
        sgdiff_out = compiled(**kwargs)[0]
        first_call = time.perf_counter() - t0
        if device.type == "cuda":
            eager_ms = _time(lambda: model(**kwargs), device, args.repeats)
            sgdiff_ms = _time(lambda: compiled(**kwargs), device, args.repeats)

    equal = torch.equal(eager_out, sgdiff_out)
    print(f"output torch.equal to eager: {equal}"
          + ("" if equal else f" (max abs diff {(eager_out.float() - sgdiff_out.float()).abs().max():.3g})"))
    if device.type == "cuda":
        print(f"first call (compile) {first_call:.1f} s; median step: eager {eager_ms:.2f} ms, "
              f"sgdiff {sgdiff_ms:.2f} ms ({eager_ms / sgdiff_ms:.2f}x)")
    else:  # a CPU time says nothing of sgdiff's speed: print no ratio
        print(f"first call (compile) {first_call:.1f} s. No speed is measured on the CPU: there every op runs "
              "its reference, the eager chain itself, so the rewrite is checked, not sped up (the Triton "
              "kernels run on CUDA).")
    if device.type == "cuda":  # CUDA graphs take the host out of the step
        graphed = torch.compile(model, backend="sgdiff", mode="reduce-overhead")
        with torch.no_grad():
            outs = [graphed(**kwargs)[0] for _ in range(4)]  # warm-up, capture, replay
            graphed_ms = _time(lambda: graphed(**kwargs), device, args.repeats)
        equal_graphed = all(torch.equal(eager_out, o) for o in outs)
        equal = equal and equal_graphed
        print(f"mode='reduce-overhead': torch.equal to eager: {equal_graphed}; median step "
              f"{graphed_ms:.2f} ms ({eager_ms / graphed_ms:.2f}x eager)")
    return 0 if equal or args.quality != "lossless" else 1
