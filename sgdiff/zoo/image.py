"""The zoo's image DiTs: ``build(size, dtype, device) -> (model, kwargs)`` per model (see
:mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ModelCase, _gen, _image_ids, _model, _place, _randn


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


def _auraflow(size, dtype, device):
    from diffusers import AuraFlowTransformer2DModel

    if size == "tiny":
        cfg = dict(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=32,
                   out_channels=4, pos_embed_max_size=64)
        batch, latent, text = 2, 8, 6
    else:  # AuraFlow v0.3 at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens, 256 Pile-T5 tokens
        cfg = dict(pos_embed_max_size=9216)
        if size == "blocks2":  # _two_blocks knows num_layers / num_single_layers, not AuraFlow's names
            cfg.update(num_mmdit_layers=1, num_single_dit_layers=1)
        batch, latent, text = 2, 128, 256
    model = _model(AuraFlowTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),  # the pipeline's t / 1000
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _hunyuandit(size, dtype, device):
    from diffusers import HunyuanDiT2DModel
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    # blocks past num_layers // 2 take a long skip (skip_norm + skip_linear); 4 layers is the fewest with one
    # (3 plain + 1 skip: an odd count above 1 pops a skip that was never pushed)
    if size == "tiny":
        cfg = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
                   num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4,
                   hidden_size=16, text_len=4, text_len_t5=4, activation_fn="gelu-approximate",
                   use_style_cond_and_image_meta_size=False)
        batch, latent = 2, 8
    else:  # HunyuanDiT v1.2 at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens, 77 CLIP + 256 mT5 tokens
        cfg = dict(num_attention_heads=16, attention_head_dim=88, in_channels=4, patch_size=2, sample_size=128,
                   hidden_size=1408, num_layers=40, mlp_ratio=4.3637, cross_attention_dim=1024,
                   cross_attention_dim_t5=2048, pooled_projection_dim=1024, text_len=77, text_len_t5=256,
                   use_style_cond_and_image_meta_size=False)
        batch, latent = 2, 128
    model = _model(HunyuanDiT2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    grid = latent // c.patch_size
    base = 512 // 8 // c.patch_size  # the pipeline's RoPE crop region for a square grid
    rope = get_2d_rotary_pos_embed(c.attention_head_dim, ((0, 0), (base, base)), (grid, grid), device=device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        timestep=torch.full((batch,), 500.0),
        encoder_hidden_states=_randn(batch, c.text_len, c.cross_attention_dim, g=g),
        text_embedding_mask=torch.ones(batch, c.text_len, dtype=torch.long),
        encoder_hidden_states_t5=_randn(batch, c.text_len_t5, c.cross_attention_dim_t5, g=g),
        text_embedding_mask_t5=torch.ones(batch, c.text_len_t5, dtype=torch.long),
        image_rotary_emb=rope,  # (cos, sin), fp32 as the pipeline makes them (_place leaves tuples alone)
        return_dict=False,
    )
    if c.use_style_cond_and_image_meta_size:  # v1.0 / v1.1
        kwargs["image_meta_size"] = torch.tensor([[1024, 1024, 1024, 1024, 0, 0]] * batch, dtype=torch.float32)
        kwargs["style"] = torch.zeros(batch, dtype=torch.long)
    return _place(model, kwargs, dtype, device)


def _cogview3plus(size, dtype, device):
    from diffusers import CogView3PlusTransformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                   out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4, pos_embed_max_size=8,
                   sample_size=8)
        latent, text, pixels = 8, 6, 64
    else:  # CogView3-Plus-3B at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens, 224 T5 tokens
        cfg, (latent, text, pixels) = dict(), (128, 224, 1024)
    model = _model(CogView3PlusTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the size conditions as the pipeline makes them: float tensors in the prompt embeddings' dtype
    size_hw = torch.tensor([[float(pixels), float(pixels)]])
    kwargs = dict(hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long), original_size=size_hw, target_size=size_hw,
                  crop_coords=torch.tensor([[0.0, 0.0]]), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _ovis_image(size, dtype, device):
    from diffusers import OvisImageTransformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8))
        batch, h, w, text = 1, 4, 4, 8
    else:  # Ovis-Image 7B (class defaults: 6 double + 27 single blocks, 3072 wide, Ovis2.5-2B text 2048) at
        # 1024x1024: 64x64 packed latent -> 4096 image tokens, 256 text tokens (the pipeline's max_sequence_length)
        cfg = dict()
        batch, h, w, text = 1, 64, 64, 256
    model = _model(OvisImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),  # the pipeline's t / 1000
        img_ids=_image_ids(h, w),
        txt_ids=torch.zeros(text, 3),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _longcat_image(size, dtype, device):
    from diffusers import LongCatImageTransformer2DModel

    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
        batch, h, w, text = 1, 4, 4, 8
    else:  # LongCat-Image (6B: 10 double + 20 single blocks, not the class default's Flux 19 + 38; 3072 wide,
        # Qwen2.5-VL-7B text 3584) at 1024x1024: 64x64 packed latent -> 4096 image tokens, 512 text tokens (the
        # pipeline's tokenizer_max_length)
        cfg = dict(num_layers=10, num_single_layers=20)
        batch, h, w, text = 1, 64, 64, 512
    model = _model(LongCatImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the pipeline's position ids: text (0, i, i); image (1, text + row, text + col)
    txt_ids = torch.stack([torch.zeros(text), torch.arange(text).float(), torch.arange(text).float()], -1)
    img_ids = _image_ids(h, w) + torch.tensor([1.0, text, text])
    kwargs = dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),  # the pipeline's t / 1000
        img_ids=img_ids,
        txt_ids=txt_ids,
        return_dict=False,  # `guidance` is accepted but unused by the model
    )
    return _place(model, kwargs, dtype, device)


def _dit(size, dtype, device):
    from diffusers import DiTTransformer2DModel

    if size == "tiny":
        cfg = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=8, num_layers=1, attention_head_dim=8,
                   num_attention_heads=2, norm_num_groups=1)
        batch, latent = 2, 8
    else:  # DiT-XL/2-256 (facebook/DiT-XL-2-256): the class defaults, learn_sigma's 8 out channels; 32x32 latent
        cfg, (batch, latent) = dict(out_channels=8), (2, 32)  # patch 2 -> 256 tokens
    model = _model(DiTTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        timestep=torch.full((batch,), 500, dtype=torch.long),
        class_labels=torch.tensor([207, 360])[:batch] % c.num_embeds_ada_norm,  # ImageNet ids, as the pipeline's
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


MODELS: Dict[str, ModelCase] = {
    "flux": ModelCase("flux", _flux, "FluxTransformer2DModel",
                      sizes=("tiny", "small", "full", "blocks2")),
    "sana": ModelCase("sana", _sana, "SanaTransformer2DModel"),
    "pixart": ModelCase("pixart", _pixart, "PixArtTransformer2DModel"),
    "flux2": ModelCase("flux2", _flux2, "Flux2Transformer2DModel (tiny: 1 double + 1 single block)"),
    "sd35": ModelCase("sd35", _sd35, "SD3Transformer2DModel, SD3.5 style (tiny: 2 layers, layer 0 dual attention, "
                                     "RMSNorm QK-norm)"),
    "qwenimage": ModelCase("qwenimage", _qwenimage, "QwenImageTransformer2DModel (tiny: 1 layer)"),
    "chroma": ModelCase("chroma", _chroma, "ChromaTransformer2DModel (tiny: 1 double + 1 single block)"),
    "cogview4": ModelCase("cogview4", _cogview4, "CogView4Transformer2DModel (tiny: 1 layer)"),
    "lumina2": ModelCase("lumina2", _lumina2, "Lumina2Transformer2DModel (tiny: 1 layer, 1 refiner layer each)",
        meta=False),
    "auraflow": ModelCase("auraflow", _auraflow, "AuraFlowTransformer2DModel (tiny: 1 MMDiT + 1 single block)"),
    "hunyuandit": ModelCase("hunyuandit", _hunyuandit, "HunyuanDiT2DModel (tiny: 4 layers, the last with a long skip)"),
    "cogview3plus": ModelCase("cogview3plus", _cogview3plus, "CogView3PlusTransformer2DModel (tiny: 1 layer)"),
    "ovis_image": ModelCase("ovis_image", _ovis_image, "OvisImageTransformer2DModel (tiny: 1 double + 1 single block)"),
    "longcat_image": ModelCase("longcat_image", _longcat_image, "LongCatImageTransformer2DModel (tiny: 1 double + 1 "
                               "single block, the pipeline's position ids)"),
    "dit": ModelCase("dit", _dit, "DiTTransformer2DModel, DiT-XL/2 (tiny: 1 layer, class-conditional)"),
}
