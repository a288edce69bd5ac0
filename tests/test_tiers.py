"""Tiers admit contracts; non-bit-exact rewrites are all-or-nothing; the extension point."""
import dataclasses

import pytest
import torch

import sgdiff
from sgdiff.tiers import Contract, Tier
from tests import example_extension as ext
from tests.capture import rewrite
from tests.helpers import NOT_ADMITTED, count_op


def fn(a, b, c):
    return a * b + c


ARGS = tuple(torch.randn(4, 8, dtype=torch.bfloat16) for _ in range(3))


def test_tiers_are_cumulative():
    assert Tier.LOSSLESS.admits(Contract.BITEXACT) and not Tier.LOSSLESS.admits(Contract.CLOSE)
    assert Tier.EXTRA_HIGH.admits(Contract.CLOSE) and not Tier.EXTRA_HIGH.admits(Contract.APPROX)
    assert all(Tier.HIGH.admits(c) for c in Contract)


def test_unknown_tier_lists_the_valid_ones():
    with pytest.raises(ValueError, match="lossless.*extra-high.*high"):
        Tier.parse("medium")


def test_close_op_is_skipped_at_lossless(example_pattern):
    run, gm, result = rewrite(fn, ARGS, quality="lossless", families=["example"])
    assert result.counts["example"] == 0
    assert [s.reason for s in result.skipped] == [NOT_ADMITTED]
    assert count_op(gm, example_pattern) == 0
    assert torch.equal(run(*ARGS), fn(*ARGS))


@pytest.mark.parametrize("tier", ["extra-high", "high"])
def test_close_op_is_rewritten_from_extra_high(example_pattern, tier):
    run, gm, result = rewrite(fn, ARGS, quality=tier, families=["example"])
    assert result.counts["example"] == 1 and count_op(gm, example_pattern) == 1
    assert torch.equal(run(*ARGS), ext.mul_add(*ARGS))


def test_close_rewrites_are_all_or_nothing(example_pattern):
    def two_sites(a, b, c, d):
        return a * b + c, a * b + d  # the second site broadcasts d: its guard fails

    args = ARGS + (torch.randn(8, dtype=torch.bfloat16),)
    run, gm, result = rewrite(two_sites, args, quality="extra-high", families=["example"])
    assert result.counts["example"] == 0
    reasons = sorted(s.reason for s in result.skipped)
    assert reasons[0].startswith("another site of this family failed its guard")
    assert reasons[1] == "operands of different shapes"


def test_pattern_names_are_unique(example_pattern):
    with pytest.raises(ValueError, match="already registered"):
        sgdiff.register_pattern(dataclasses.replace(ext.PATTERN))


def test_manager_identity_covers_tier_and_patterns(example_pattern):
    a, b = sgdiff.PassManager("lossless"), sgdiff.PassManager("extra-high")
    assert a.uuid() != b.uuid() and a.uuid() == sgdiff.PassManager("lossless").uuid()
    assert sgdiff.PassManager("lossless", families=["modulate"]).uuid() != a.uuid()


def test_spec_looser_than_its_op_is_refused():
    from sgdiff.kernels.registry import KernelSpec, register_kernel

    with pytest.raises(ValueError, match="looser"):
        register_kernel(KernelSpec("layernorm_modulate", "sloppy", Contract.CLOSE, "x:y"))


def test_per_call_switch_picks_a_separate_variant(example_pattern):
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options

    results = []
    options = Options(families=("example",))  # `a * b + c` is also a gated residual
    compiled = torch.compile(fn, backend=SgdiffBackend(options, on_result=results.append))
    lossless = compiled(*ARGS)
    with sgdiff.quality("extra-high"):
        extra = compiled(*ARGS)
    again = compiled(*ARGS)
    assert [r.tier for r in results] == [Tier.LOSSLESS, Tier.EXTRA_HIGH]
    assert [r.counts["example"] for r in results] == [0, 1]
    assert torch.equal(lossless, fn(*ARGS)) and torch.equal(again, lossless)
    assert torch.equal(extra, ext.mul_add(*ARGS))
    torch._dynamo.reset()


def test_the_three_tiers_are_served_in_turn_without_recompiling(monkeypatch):
    """A Flux of real block structure switched between the three tiers call by call: Dynamo
    compiles the model once, and the first use of each tier builds that tier's variant (one
    pass-manager run each); the calls after it, in any order, compile and rewrite nothing, and
    each tier's output stays what its first call gave (lossless's equal to eager's; high's its
    own FP8 math, not lossless's)."""
    from sgdiff import _compat, zoo
    from sgdiff.backend import SgdiffBackend
    from sgdiff.options import Options
    from sgdiff.patterns import fp8_gemm

    monkeypatch.setattr(fp8_gemm, "MIN_FLOP", 2 ** 24)  # the small model's projections are FP8 sites at high
    torch._dynamo.reset()
    model, kw = zoo.build("flux", size="small", dtype=torch.bfloat16)
    results = []
    compiled = torch.compile(model, backend=SgdiffBackend(Options(cudagraphs=False), on_result=results.append))
    tiers = ("lossless", "extra-high", "high")
    before = _compat.graphs_compiled()
    first = {}
    with torch.no_grad():
        want = model(**kw)[0]
        for round_ in range(2):
            for tier in (tiers if round_ == 0 else tiers[::-1]):
                with sgdiff.quality(tier):
                    out = compiled(**kw)[0]
                if tier in first:
                    assert torch.equal(out, first[tier]), tier
                first.setdefault(tier, out)
            if round_ == 0:
                variants_after_first_use = [r.tier.value for r in results]
    assert variants_after_first_use == list(tiers) and [r.tier.value for r in results] == list(tiers)
    assert _compat.graphs_compiled() - before == 1
    assert results[2].counts["fp8_gemm"] == 36
    assert torch.equal(first["lossless"], want) and not torch.equal(first["high"], want)
    torch._dynamo.reset()
