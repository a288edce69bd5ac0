"""sgdiff.optimize and sgdiff.explain on a diffusers pipeline: a tiny FluxPipeline (tiny
transformer, tiny VAE, scheduler; prompt embeddings given, no text encoders)."""
import pytest
import torch

import sgdiff

pytest.importorskip("transformers")  # diffusers' FluxPipeline imports it
diffusers = pytest.importorskip("diffusers")


# The VAE's mid-block attention group-norms a transposed tensor: captured by aot_autograd (any
# aot backend, aot_eager too), ATen's CPU native_group_norm then refuses the non-contiguous
# input (torch 2.13, CPU). On CUDA the tiny VAE keeps its attention.
MID_BLOCK_ATTENTION = torch.cuda.is_available()


def tiny_pipeline():
    torch.manual_seed(0)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()
    vae = diffusers.AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=1,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
        scaling_factor=1.5035, mid_block_add_attention=MID_BLOCK_ATTENTION).eval()
    return diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def call(pipe):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return pipe(prompt_embeds=torch.randn(1, 8, 32, generator=g), pooled_prompt_embeds=torch.randn(1, 32, generator=g),
                    height=16, width=16, num_inference_steps=2, output_type="pt",
                    generator=torch.Generator().manual_seed(0)).images


@pytest.mark.parametrize("regional", [False, True])
def test_an_optimized_pipeline_gives_eager_bits(regional):
    pipe = tiny_pipeline()
    want = call(pipe)
    decode = pipe.vae.decode
    assert sgdiff.optimize(pipe, regional=regional) is pipe
    assert pipe.vae.decode is not decode and "decode" in vars(pipe.vae)  # compiled, on the instance
    if regional:  # block by block: the module itself stays
        assert type(pipe.transformer).__name__ == "FluxTransformer2DModel"
    else:
        assert pipe.transformer is not pipe.transformer._orig_mod
    assert torch.equal(call(pipe), want)
    assert torch.equal(call(pipe), want)  # and again, compiled


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
