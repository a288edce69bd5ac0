"""sgdiff.optimize and sgdiff.explain on a diffusers pipeline: a tiny FluxPipeline and a tiny
ZImagePipeline (tiny transformer, tiny VAE, scheduler; prompt embeddings given, no text encoders)."""
import pytest
import torch

import sgdiff

pytest.importorskip("transformers")  # diffusers' FluxPipeline imports it
diffusers = pytest.importorskip("diffusers")


_CALL = {}  # the tiny pipeline's call arguments: its embeddings, the same every call


def tiny_pipeline(name="flux"):
    """A tiny FluxPipeline, or another of the zoo's (tiny transformer and VAE, scheduler, no text
    encoders)."""
    from sgdiff import zoo

    pipe, kwargs = zoo.build_pipeline(name, "tiny")
    _CALL.clear()
    _CALL.update(kwargs)
    return pipe


def call(pipe):
    with torch.no_grad():
        return pipe(**dict(_CALL, generator=torch.Generator().manual_seed(0))).images


@pytest.mark.parametrize("regional", [False, True])
@pytest.mark.parametrize("name", ["flux", "zimage"])  # Z-Image's DiT takes and returns per-image lists
def test_an_optimized_pipeline_gives_eager_bits(name, regional):
    pipe = tiny_pipeline(name)
    want = call(pipe)
    decode, denoiser = pipe.vae.decode, type(pipe.transformer)
    assert sgdiff.optimize(pipe, regional=regional) is pipe
    assert pipe.vae.decode is not decode and "decode" in vars(pipe.vae)  # compiled, on the instance
    if regional:  # block by block: the module itself stays
        assert type(pipe.transformer) is denoiser
    else:
        assert pipe.transformer is not pipe.transformer._orig_mod
    assert torch.equal(call(pipe), want)
    assert torch.equal(call(pipe), want)  # and again, compiled


@pytest.mark.parametrize("kwargs, vae_graphs", [({}, False), ({"cudagraphs": True}, True), ({"cudagraphs": False}, False),
                                               ({"mode": "reduce-overhead"}, True)])
def test_the_vae_runs_without_cuda_graphs_unless_asked(monkeypatch, kwargs, vae_graphs):
    graphs = {}
    compile_ = torch.compile

    def record(fn, **kw):
        graphs[getattr(fn, "__name__", "denoiser")] = kw["backend"].options.cudagraphs
        return compile_(fn, **kw)

    monkeypatch.setattr(torch, "compile", record)
    sgdiff.optimize(tiny_pipeline(), **kwargs)
    assert graphs == {"denoiser": kwargs.get("cudagraphs", True), "decode": vae_graphs, "encode": vae_graphs}


def test_a_pipeline_without_a_denoiser_is_refused():
    class NotAPipeline:
        components = {"scheduler": None}

    with pytest.raises(ValueError, match="no denoiser"):
        sgdiff.optimize(NotAPipeline())


def test_explain_reports_each_part_and_puts_the_pipeline_back():
    pipe = tiny_pipeline()
    want = call(pipe)
    sgdiff.optimize(pipe)
    compiled_transformer, compiled_decode = pipe.transformer, pipe.vae.decode
    report = sgdiff.explain(pipe, prompt_embeds=torch.randn(1, 8, 32), pooled_prompt_embeds=torch.randn(1, 32),
                            height=16, width=16, num_inference_steps=2, output_type="pt")
    assert list(report.parts) == ["transformer", "vae.decode", "vae.encode"]
    flux = report["transformer"]
    assert flux.graphs >= 1 and flux.counts["modulate"] >= 2 and flux.counts["qk_norm"] >= 2, str(flux)
    assert report["vae.decode"].graphs >= 1 and report["vae.encode"].graphs == 0  # text-to-image: no encode
    assert "[transformer] sgdiff report" in str(report) and "[vae.decode]" in str(report)
    assert pipe.transformer is compiled_transformer and pipe.vae.decode is compiled_decode  # put back
    assert "forward" not in vars(pipe.transformer._orig_mod)
    assert torch.equal(call(pipe), want)
