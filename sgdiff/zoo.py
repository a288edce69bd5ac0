"""diffusers DiTs with random weights and matching inputs, for the demo, tests and benchmarks.

``build("flux", size="tiny")`` returns ``(model, kwargs)``; ``model(**kwargs)`` runs one
denoising step. ``tiny`` configs keep every chain the real model has (one block of each kind)
at toy widths; ``full`` configs are the published architectures with random weights, at a
published resolution; ``blocks2`` is ``full`` with two blocks (one of each kind where the model
has two kinds): the real widths and inputs, where launch time weighs as much as the kernels.
Needs diffusers (the ``test`` or ``bench`` extra).
"""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo_more_dits import MODELS as MORE_MODELS
from sgdiff.zoo_parts import ModelCase, _gen, _image_ids, _model, _place, _randn, wan_like


def _flux(size, dtype, device):
    from diffusers import FluxTransformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                   axes_dims_rope=[4, 4, 8])
        batch, h, w, text = 1, 4, 4, 8
    elif size == "small":  # a few blocks at a width where kernels matter more than dispatch
        cfg = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4, attention_head_dim=64,
                   num_attention_heads=4, joint_attention_dim=256, pooled_projection_dim=256,
                   axes_dims_rope=[8, 28, 28])
        batch, h, w, text = 1, 32, 32, 64
    else:  # Flux.1-dev, 1024x1024: 4096 image tokens, 512 text tokens
        cfg = dict(guidance_embeds=True)
        batch, h, w, text = 1, 64, 64, 512
    model = _model(FluxTransformer2DModel, cfg, size)
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, cfg["in_channels"] if "in_channels" in cfg else 64, g=g),
        encoder_hidden_states=_randn(batch, text, cfg.get("joint_attention_dim", 4096), g=g),
        pooled_projections=_randn(batch, cfg.get("pooled_projection_dim", 768), g=g),
        timestep=torch.full((batch,), 0.5),
        img_ids=_image_ids(h, w),
        txt_ids=torch.zeros(text, 3),
        return_dict=False,
    )
    if cfg.get("guidance_embeds"):
        kwargs["guidance"] = torch.full((batch,), 3.5)
    return _place(model, kwargs, dtype, device)


def _sana(size, dtype, device):
    from diffusers import SanaTransformer2DModel

    if size == "tiny":
        cfg = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                   num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
                   caption_channels=16, sample_size=8, patch_size=1)
        batch, latent, text = 2, 8, 6
    else:  # Sana 1.6B at 1024x1024: 32x32 latent, patch 1
        cfg = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                   num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
                   cross_attention_dim=2240, caption_channels=2304, sample_size=32, patch_size=1)
        batch, latent, text = 2, 32, 300
    model = _model(SanaTransformer2DModel, cfg, size)
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, cfg["in_channels"], latent, latent, g=g),
        encoder_hidden_states=_randn(batch, text, cfg["caption_channels"], g=g),
        timestep=torch.full((batch,), 500.0),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _pixart(size, dtype, device):
    from diffusers import PixArtTransformer2DModel

    if size == "tiny":
        cfg = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=1,
                   cross_attention_dim=16, caption_channels=16, sample_size=8, patch_size=2,
                   norm_type="ada_norm_single", use_additional_conditions=False)
        batch, latent, text = 2, 8, 6
    else:  # PixArt-Sigma 1024: 128x128 latent, patch 2 -> 4096 tokens, hidden 1152
        cfg = dict(sample_size=128, num_attention_heads=16, attention_head_dim=72, in_channels=4,
                   out_channels=8, num_layers=28, cross_attention_dim=1152, caption_channels=4096,
                   patch_size=2, norm_type="ada_norm_single", use_additional_conditions=False)
        batch, latent, text = 2, 128, 300
    model = _model(PixArtTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        encoder_hidden_states=_randn(batch, text, c.caption_channels, g=g),
        timestep=torch.full((batch,), 500.0),
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


MODELS: Dict[str, ModelCase] = {
    "flux": ModelCase("flux", _flux, "FluxTransformer2DModel",
                      sizes=("tiny", "small", "full", "blocks2")),
    "sana": ModelCase("sana", _sana, "SanaTransformer2DModel"),
    "pixart": ModelCase("pixart", _pixart, "PixArtTransformer2DModel"),
}


def build(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32,
          device: "torch.device | str" = "cpu", seed: int = 0):
    """``(model, kwargs)`` for model ``name`` with random weights (seeded)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if size not in MODELS[name].sizes:
        raise ValueError(f"{name} comes in sizes {MODELS[name].sizes}, not {size!r}")
    torch.manual_seed(seed)
    with torch.device(device):  # weights are made where they run (a full Flux is 12 B parameters)
        return MODELS[name].build(size, dtype, torch.device(device))


def flux_inputs_at(kwargs: dict, side: int) -> dict:
    """Flux's (or Chroma's) ``kwargs`` at a ``side`` x ``side`` latent: fresh random latents of
    that token count (``kwargs``' batch, channels, dtype and device) and their position ids."""
    x = kwargs["hidden_states"]
    return dict(kwargs, hidden_states=torch.randn(x.shape[0], side * side, x.shape[-1], device=x.device, dtype=x.dtype),
                img_ids=_image_ids(side, side).to(x.device))


def _flux2(size, dtype, device):
    from diffusers import Flux2Transformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=32,
                   axes_dims_rope=(4, 4, 4, 4))
        batch, h, w, text = 1, 4, 4, 8
    else:  # FLUX.2-dev, 1024x1024: 4096 image tokens, 512 text tokens
        cfg = dict()
        batch, h, w, text = 1, 64, 64, 512
    model = _model(Flux2Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.arange(h).float(),
                                         torch.arange(w).float(), indexing="ij"), -1)
    txt_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.zeros(1),
                                         torch.arange(text).float(), indexing="ij"), -1)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),
        img_ids=img_ids.reshape(-1, 4),
        txt_ids=txt_ids.reshape(-1, 4),
        guidance=torch.full((batch,), 3.5),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _sd35(size, dtype, device):
    from diffusers import SD3Transformer2DModel

    if size == "tiny":
        cfg = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                   num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
                   pooled_projection_dim=32, out_channels=4, pos_embed_max_size=8,
                   dual_attention_layers=(0,), qk_norm="rms_norm")
        batch, latent, text = 2, 8, 6
    else:  # SD3.5 Medium at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens, 333 text tokens
        cfg = dict(num_layers=24, num_attention_heads=24, caption_projection_dim=1536, pos_embed_max_size=384,
                   dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
        batch, latent, text = 2, 128, 333
    model = _model(SD3Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        pooled_projections=_randn(batch, c.pooled_projection_dim, g=g),
        timestep=torch.full((batch,), 500.0),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _wan(size, dtype, device):
    from diffusers import WanTransformer3DModel

    # Wan 2.1 T2V 1.3B, 480p, 81 frames: 21x60x104 latent
    return wan_like(WanTransformer3DModel, dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
                    (21, 60, 104, 512), size, dtype, device)


def _qwenimage(size, dtype, device):
    from diffusers import QwenImageTransformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6))
        batch, h, w, text = 1, 4, 4, 8
    else:  # Qwen-Image at 1024x1024: 64x64 packed latent tokens
        cfg = dict()
        batch, h, w, text = 1, 64, 64, 512
    model = _model(QwenImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),
        img_shapes=[(1, h, w)] * batch,
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _chroma(size, dtype, device):
    from diffusers import ChromaTransformer2DModel

    # Flux's blocks, modulated by an approximator's table instead of per-block linears
    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8), approximator_hidden_dim=32,
                   approximator_layers=1)
        h, w, text = 4, 4, 8
    else:  # Chroma1-HD at 1024x1024: 4096 image tokens, 512 text tokens
        cfg, (h, w, text) = dict(), (64, 64, 512)
    model = _model(ChromaTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, h * w, c.in_channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.joint_attention_dim, g=g),
                  timestep=torch.full((1,), 0.5), img_ids=_image_ids(h, w), txt_ids=torch.zeros(text, 3),
                  return_dict=False)
    return _place(model, kwargs, dtype, device)


def _cogvideox(size, dtype, device):
    from diffusers import CogVideoXTransformer3DModel

    if size == "tiny":
        cfg = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
                   text_embed_dim=16, num_layers=1, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
                   temporal_compression_ratio=4, max_text_seq_length=8)
        frames, h, w, text = 3, 8, 8, 8
    else:  # CogVideoX-2b, 720x480 x 49 frames: 13 x 60 x 90 latent, 226 text tokens
        cfg, (frames, h, w, text) = dict(), (13, 60, 90, 226)
    model = _model(CogVideoXTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, frames, c.in_channels, h, w, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  timestep=torch.full((1,), 500.0), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _ltx(size, dtype, device):
    from diffusers import LTXVideoTransformer3DModel

    if size == "tiny":
        cfg = dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
                   attention_head_dim=8, cross_attention_dim=16, num_layers=1, caption_channels=16)
        frames, h, w, text = 2, 4, 4, 6
    else:  # LTX-Video, 704x480 x 121 frames: 16 x 15 x 22 latent, 128 text tokens
        cfg, (frames, h, w, text) = dict(), (16, 15, 22, 128)
    model = _model(LTXVideoTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, frames * h * w, c.in_channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.caption_channels, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long), encoder_attention_mask=torch.ones(1, text),
                  num_frames=frames, height=h, width=w, return_dict=False)
    return _place(model, kwargs, dtype, device)


def _hunyuanvideo(size, dtype, device):
    from diffusers import HunyuanVideoTransformer3DModel

    if size == "tiny":
        cfg = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                   num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                   text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4))
        frames, h, w, text = 1, 8, 8, 6
    else:  # HunyuanVideo, 960x544 x 33 frames: 9 x 68 x 120 latent, 256 text tokens
        cfg, (frames, h, w, text) = dict(), (9, 68, 120, 256)
    model = _model(HunyuanVideoTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  encoder_attention_mask=torch.ones(1, text),
                  pooled_projections=_randn(1, c.pooled_projection_dim, g=g),
                  guidance=torch.full((1,), 3500.0), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _cogview4(size, dtype, device):
    from diffusers import CogView4Transformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=4, num_attention_heads=4,
                   out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4)
        latent, text, pixels = 8, 6, 64
    else:  # CogView4-6B at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens
        cfg, (latent, text, pixels) = dict(), (128, 128, 1024)
    model = _model(CogView4Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    size_hw = torch.tensor([[pixels, pixels]])
    kwargs = dict(hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long), original_size=size_hw, target_size=size_hw,
                  crop_coords=torch.tensor([[0, 0]]), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _lumina2(size, dtype, device):
    from diffusers import Lumina2Transformer2DModel

    if size == "tiny":
        cfg = dict(sample_size=8, in_channels=4, hidden_size=32, num_layers=1, num_refiner_layers=1,
                   num_attention_heads=2, num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 6, 6), cap_feat_dim=8)
        latent, text = 8, 6
    else:  # Lumina-Image 2.0 at 1024x1024: 128x128 latent, Gemma-2-2B's 2304-wide captions, 256 tokens
        cfg, (latent, text) = dict(cap_feat_dim=2304), (128, 256)
    model = _model(Lumina2Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
                  encoder_hidden_states=_randn(1, text, c.cap_feat_dim, g=g), timestep=torch.full((1,), 0.5),
                  encoder_attention_mask=torch.ones(1, text, dtype=torch.bool), return_dict=False)
    return _place(model, kwargs, dtype, device)


MODELS.update({
    "flux2": ModelCase("flux2", _flux2, "Flux2Transformer2DModel (tiny: 1 double + 1 single block)"),
    "sd35": ModelCase("sd35", _sd35, "SD3Transformer2DModel, SD3.5 style (tiny: 2 layers, layer 0 dual attention, "
                                     "RMSNorm QK-norm)"),
    "wan": ModelCase("wan", _wan, "WanTransformer3DModel (tiny: 1 layer)"),
    "qwenimage": ModelCase("qwenimage", _qwenimage, "QwenImageTransformer2DModel (tiny: 1 layer)"),
    "chroma": ModelCase("chroma", _chroma, "ChromaTransformer2DModel (tiny: 1 double + 1 single block)"),
    "cogvideox": ModelCase("cogvideox", _cogvideox, "CogVideoXTransformer3DModel (tiny: 1 layer)"),
    "ltx": ModelCase("ltx", _ltx, "LTXVideoTransformer3DModel (tiny: 1 layer)"),
    "cogview4": ModelCase("cogview4", _cogview4, "CogView4Transformer2DModel (tiny: 1 layer)"),
    "lumina2": ModelCase("lumina2", _lumina2, "Lumina2Transformer2DModel (tiny: 1 layer, 1 refiner layer each)"),
    "hunyuanvideo": ModelCase("hunyuanvideo", _hunyuanvideo, "HunyuanVideoTransformer3DModel (tiny: 1 double + 1 "
                              "single block, 1 token-refiner layer)"),
})


MODELS.update(MORE_MODELS)


# --- pipelines: a denoiser above, a VAE and a scheduler; text encoders absent, embeddings given ---

def _flux_vae(size):
    from diffusers import AutoencoderKL

    if size == "tiny":  # the mid-block's attention only on CUDA: ATen's CPU group norm refuses the
        # transposed input it gets there once captured (torch 2.13)
        return AutoencoderKL(block_out_channels=(4,), layers_per_block=1, latent_channels=4, norm_num_groups=1,
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


def build_pipeline(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32, device="cpu"):
    """``(pipe, call_kwargs)``: a diffusers pipeline with random weights (the denoiser of
    :func:`build`, a VAE of the model's, a flow-matching Euler scheduler), no text encoders;
    ``pipe(**call_kwargs)`` runs it from given prompt embeddings and returns a tensor
    (``output_type="pt"``). ``full``: Flux.1-dev at 1024², 28 steps; Wan 2.1 1.3B at 480p x 81
    frames, 50 steps with classifier-free guidance."""
    import diffusers

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
    else:
        raise ValueError(f"no pipeline for {name!r}; known: flux, wan")
    pipe.vae.to(device=device, dtype=dtype).eval().requires_grad_(False)
    for key in ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds"):
        if key in call:
            call[key] = call[key].to(device=device, dtype=dtype)
    return pipe, dict(call, output_type="pt", generator=torch.Generator(device="cpu").manual_seed(0))
