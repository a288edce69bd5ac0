"""Step caching composes exactly: diffusers' first-block cache (``transformer.enable_cache(
FirstBlockCacheConfig(threshold))``) decides per step, from the first block's residual, whether
to run the other blocks or reuse their cached residual. A lossless sgdiff pipeline computes
eager's bits, so it makes eager's decisions step for step (a compile that is not bitwise can
flip one where the residual sits near the threshold) and its output is eager's-with-cache.
Here on the CPU (the references run); tests/gpu/test_caching_gpu.py runs it with the kernels."""
import logging

import torch
from diffusers.hooks import FirstBlockCacheConfig
import diffusers.hooks.first_block_cache as first_block_cache

import sgdiff
from sgdiff import zoo

THRESHOLD = 0.4  # the tiny Flux's 8 steps: some blocks run, some reuse the cache (checked below)
DECIDE = first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks


def cached_run(device: str, dtype: torch.dtype, compiled: bool, monkeypatch):
    """The tiny Flux pipeline with a first-block cache, 8 steps: (latents, the per-step decisions
    to run the remaining blocks)."""
    decisions = []

    def record(self, residual):  # runs eagerly under torch.compile too (diffusers disables it there)
        decisions.append(bool(DECIDE(self, residual)))
        return decisions[-1]

    monkeypatch.setattr(first_block_cache.FBCHeadBlockHook, "_should_compute_remaining_blocks",
                        torch.compiler.disable(record))
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    torch._dynamo.reset()
    pipe, call = zoo.build_pipeline("flux", "tiny", dtype=dtype, device=device)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=THRESHOLD))
    if compiled:
        sgdiff.optimize(pipe)
    try:
        with torch.no_grad():
            out = pipe(**dict(call, num_inference_steps=8, output_type="latent")).images
    finally:
        torch._dynamo.reset()
    return out, decisions


def check_same_decisions(device, dtype, monkeypatch):
    want, eager_decisions = cached_run(device, dtype, False, monkeypatch)
    assert True in eager_decisions[1:] and False in eager_decisions, eager_decisions  # both kinds of step
    got, decisions = cached_run(device, dtype, True, monkeypatch)
    assert decisions == eager_decisions
    assert torch.equal(got, want)


def test_first_block_cache_makes_eagers_decisions(monkeypatch):
    check_same_decisions("cpu", torch.float32, monkeypatch)
