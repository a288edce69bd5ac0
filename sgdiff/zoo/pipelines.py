"""The zoo's VAEs (Flux's ``AutoencoderKL``, Wan 2.1's ``AutoencoderKLWan``) and pipelines: a denoiser
of :func:`sgdiff.zoo.build`, a VAE of the model's and a scheduler; text encoders absent, embeddings
given."""
from __future__ import annotations

import torch

from sgdiff.zoo.parts import _gen, _randn


def _flux_vae(size, latent_channels: int = 4):
    from diffusers import AutoencoderKL

    if size == "tiny":  # the mid-block's attention only on CUDA: ATen's CPU group norm refuses the
        # transposed input it gets there once captured (torch 2.13); Z-Image's tiny DiT takes 16 channels
        return AutoencoderKL(block_out_channels=(4,), layers_per_block=1, latent_channels=latent_channels,
                             norm_num_groups=1,
                             use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                             scaling_factor=1.5035, mid_block_add_attention=torch.cuda.is_available())
    # FLUX.1-dev's VAE: 16 latent channels, 8x spatial
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
                         use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.1159,
                         scaling_factor=0.3611, sample_size=1024)


def _wan_vae(size):
    from diffusers import AutoencoderKLWan

    if size == "tiny":
        return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
                                latents_mean=[0.0] * 4, latents_std=[1.0] * 4, scale_factor_temporal=2,
                                scale_factor_spatial=2)
    return AutoencoderKLWan()  # Wan 2.1's VAE


def _sana_vae(size):
    from diffusers import AutoencoderDC

    blocks = ("ResBlock",) * 3 + ("EfficientViTBlock",) * 3
    if size == "tiny":
        return AutoencoderDC(latent_channels=4, attention_head_dim=8, encoder_block_types=blocks[2:4],
                             decoder_block_types=blocks[2:4], encoder_block_out_channels=(8, 16),
                             decoder_block_out_channels=(8, 16), encoder_layers_per_block=(1, 1),
                             decoder_layers_per_block=(1, 1), encoder_qkv_multiscales=((), (5,)),
                             decoder_qkv_multiscales=((), (5,)), downsample_block_type="conv",
                             upsample_block_type="interpolate", scaling_factor=0.41407)
    # Sana 1.0's DC-AE (dc-ae-f32c32-sana-1.0): 32 latent channels, 32x spatial
    return AutoencoderDC(latent_channels=32, encoder_block_types=blocks, decoder_block_types=blocks,
                         encoder_layers_per_block=(2, 2, 2, 3, 3, 3), decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
                         downsample_block_type="conv", upsample_block_type="interpolate", scaling_factor=0.41407)


def build_pipeline(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32, device="cpu"):
    """``(pipe, call_kwargs)``: a diffusers pipeline with random weights (the denoiser of
    :func:`build`, a VAE of the model's, a flow-matching Euler scheduler), no text encoders;
    ``pipe(**call_kwargs)`` runs it from given prompt embeddings and returns a tensor
    (``output_type="pt"``). ``full``: Flux.1-dev at 1024², 28 steps; Wan 2.1 1.3B at 480p x 81
    frames, 50 steps with classifier-free guidance; Sana 1.6B at 1024², 20 steps with guidance
    (its DC-AE decoding 32x); Z-Image-Turbo at 1024², 9 steps, no guidance."""
    import diffusers

    from sgdiff.zoo import build

    transformer, _ = build(name, size, dtype=dtype, device=device)
    g = _gen(device)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    if name == "flux":
        vae = _flux_vae(size)
        pipe = diffusers.FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                                      text_encoder_2=None, tokenizer_2=None, transformer=transformer)
        c = transformer.config
        text = 8 if size != "full" else 512
        call = dict(prompt_embeds=_randn(1, text, c.joint_attention_dim, g=g),
                    pooled_prompt_embeds=_randn(1, c.pooled_projection_dim, g=g),
                    height=16 if size != "full" else 1024, width=16 if size != "full" else 1024,
                    num_inference_steps=2 if size != "full" else 28, guidance_scale=3.5)
    elif name == "wan":
        vae = _wan_vae(size)
        pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                     transformer=transformer)
        text, dim = (6, transformer.config.text_dim) if size != "full" else (512, transformer.config.text_dim)
        call = dict(prompt_embeds=_randn(1, text, dim, g=g), negative_prompt_embeds=_randn(1, text, dim, g=g),
                    height=16 if size != "full" else 480, width=16 if size != "full" else 832,
                    num_frames=5 if size != "full" else 81, num_inference_steps=2 if size != "full" else 50,
                    guidance_scale=5.0)
    elif name == "sana":
        vae = _sana_vae(size)
        pipe = diffusers.SanaPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                      scheduler=scheduler)
        c = transformer.config
        text = 6 if size != "full" else 300
        side = 32 if size != "full" else 1024  # the pipeline takes multiples of 32
        call = dict(prompt_embeds=_randn(1, text, c.caption_channels, g=g), prompt_attention_mask=torch.ones(1, text),
                    negative_prompt_embeds=_randn(1, text, c.caption_channels, g=g),
                    negative_prompt_attention_mask=torch.ones(1, text), negative_prompt=None, height=side, width=side,
                    num_inference_steps=2 if size != "full" else 20, guidance_scale=4.5,
                    use_resolution_binning=False)
    elif name == "zimage":  # Z-Image-Turbo: 9 steps (8 of the DiT), no guidance; Flux's VAE
        vae = _flux_vae(size, latent_channels=transformer.dit.config.in_channels)
        transformer = transformer.dit  # the pipeline passes and takes per-image lists itself
        pipe = diffusers.ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                                        transformer=transformer)
        text = 8 if size != "full" else 128
        side = 16 if size != "full" else 1024
        call = dict(prompt_embeds=[_randn(text, transformer.config.cap_feat_dim, g=g)], height=side, width=side,
                    num_inference_steps=2 if size != "full" else 9, guidance_scale=0.0)
    else:
        raise ValueError(f"no pipeline for {name!r}; known: flux, wan, sana, zimage")
    pipe.vae.to(device=device, dtype=dtype).eval().requires_grad_(False)
    for key in ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds"):
        if isinstance(call.get(key), list):  # Z-Image: one tensor per prompt
            call[key] = [t.to(device=device, dtype=dtype) for t in call[key]]
        elif key in call:
            call[key] = call[key].to(device=device, dtype=dtype)
    for key in ("prompt_attention_mask", "negative_prompt_attention_mask"):  # on the device, in their own dtype:
        if key in call:  # the pipeline moves only the masks it makes itself
            call[key] = call[key].to(device=device)
    return pipe, dict(call, output_type="pt", generator=torch.Generator(device="cpu").manual_seed(0))
