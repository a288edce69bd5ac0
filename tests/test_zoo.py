"""Every chain family, found in real diffusers DiTs (tiny configs, random weights, CPU), and the
compiled model bitwise equal to eager: each zoo model held to the counts of
:mod:`sgdiff.zoo.sites` (where each count comes from is written there)."""
import logging

import pytest
import torch

import sgdiff
from sgdiff import zoo
from sgdiff.zoo import sites
from tests.helpers import bits_equal, compiled_with_its_report, not_admitted

FAMILIES = sites.FAMILIES
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module", params=[(m, d) for m in sites.REWRITTEN for d in sites.dtypes_of(m, tuple(DTYPES))],
                ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    """One model per name and dtype, built once: (name, model, kwargs, eager output)."""
    name, dtype = request.param
    logging.getLogger("diffusers").setLevel(logging.ERROR)  # the `.to(dtype)` fp32-modules notice
    model, kwargs = zoo.build(name, dtype=DTYPES[dtype])
    with torch.no_grad():
        eager = model(**kwargs)[0]
    return name, dtype, model, kwargs, eager


def test_every_chain_is_found_and_rewritten_and_the_compiled_model_is_bitwise_equal_to_eager(case):
    name, dtype, model, kwargs, eager = case
    got, report = compiled_with_its_report(model, kwargs)
    assert tuple(report.counts[f] for f in FAMILIES) == tuple(sites.rewritten(name, dtype).values()), str(report)
    # nothing of these families was found and left eager, but for chains lossless does not admit (linear +
    # GELU, attention, FP8 GEMMs) and the skips the model's entry lists (a missed spelling, a candidate that is
    # no chain)
    known = sites.SKIPS.get(name, set())
    assert all(not_admitted(reason) or (f, op, reason) in known for f, op, reason in report.skipped), report.skipped
    if not known:
        assert all(report.found[f] == report.counts[f] for f in FAMILIES if f != "activation"), report.skipped
    assert bits_equal(got, eager)


def test_explaining_models_in_a_row_reports_first_compiles():
    """Explains of other models one after another (other sizes to torch.compile, which traces
    each from explain's own frame): each report is that of a first, static compile, not one
    with the symbolic sizes torch.compile's automatic dynamic gives a recompile."""
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    for name in ("flux", "sana"):
        model, kwargs = zoo.build(name, dtype=torch.bfloat16)
        report = sgdiff.explain(model, **kwargs)
        assert tuple(report.counts[f] for f in FAMILIES) == tuple(sites.rewritten(name).values()), str(report)
        assert all(not_admitted(reason) for _, _, reason in report.skipped), report.skipped


# extra-high adds the close rewrites: each projection + GELU-tanh (feed-forwards, caption and
# text projections) becomes linear_gelu_tanh, beside the lossless activation sites
EXTRA_HIGH_ACTIVATION = {"flux": 3, "wan": 2, "pixart": 2, "sd35": 3, "qwenimage": 1, "sana": 3}
EXTRA_HIGH_ATTENTION = {"flux": 2, "wan": 2, "pixart": 2, "sd35": 1, "qwenimage": 1, "sana": 1}


@pytest.mark.parametrize("name", sorted(EXTRA_HIGH_ACTIVATION))
def test_extra_high_adds_each_projection_gelu_and_stays_close(name):
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    model, kwargs = zoo.build(name, dtype=torch.bfloat16)
    lossless, extra = sgdiff.explain(model, **kwargs), sgdiff.explain(model, quality="extra-high", **kwargs)
    assert extra.counts["activation"] == EXTRA_HIGH_ACTIVATION[name], str(extra)
    assert all(extra.counts[f] == lossless.counts[f] for f in FAMILIES if f != "activation")
    # and every attention site but masked ones (no site); only high's approx ops stay eager
    assert extra.counts["attention"] == extra.found["attention"] == EXTRA_HIGH_ATTENTION[name], str(extra)
    assert all(not_admitted(reason, "extra-high") and "approx" in reason for _, _, reason in extra.skipped)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            eager = model(**kwargs)[0].float()
            got = torch.compile(model, backend="sgdiff", options={"quality": "extra-high"})(**kwargs)[0].float()
    finally:
        torch._dynamo.reset()
    assert not torch.equal(got, eager)  # the rewrite ran: one rounding fewer
    assert (got - eager).abs().max() <= 0.05 * eager.abs().max()


def test_every_model_class_of_diffusers_transformers_is_in_the_zoo_or_named_as_no_dit():
    """Each model class ``diffusers.models.transformers`` defines is built by a zoo entry (its
    class named in the entry's description) or listed in ``sites.NOT_DITS`` with why it is no
    image or video DiT; ``sites.NOT_YET`` names what is left to build."""
    import importlib
    import inspect
    import pkgutil

    import diffusers.models.transformers as transformers
    from diffusers.models.modeling_utils import ModelMixin

    classes = set()
    for info in pkgutil.iter_modules(transformers.__path__):
        module = importlib.import_module(f"{transformers.__name__}.{info.name}")
        classes |= {name for name, c in vars(module).items()
                    if inspect.isclass(c) and issubclass(c, ModelMixin) and c.__module__ == module.__name__}
    built = {name for name in classes if any(case.doc.split()[0].rstrip(",") == name for case in zoo.MODELS.values())}
    assert classes - built - set(sites.NOT_DITS) == set(sites.NOT_YET), sorted(classes - built - set(sites.NOT_DITS))
    assert not built & set(sites.NOT_DITS)
