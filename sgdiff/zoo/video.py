"""The zoo's video DiTs: ``build(size, dtype, device) -> (model, kwargs)`` per model (see
:mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ModelCase, _gen, _model, _place, _randn, wan_like


def _wan(size, dtype, device):
    from diffusers import WanTransformer3DModel

    # Wan 2.1 T2V 1.3B, 480p, 81 frames: 21x60x104 latent
    return wan_like(WanTransformer3DModel, dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
                    (21, 60, 104, 512), size, dtype, device)


def _wan22_ti2v(size, dtype, device):
    """Wan 2.2 TI2V 5B, 704x1280 x 121 frames (31x44x80 latent of 48 channels), with a timestep
    per token as its image-to-video pipeline gives it: the first frame's tokens at 0 (the
    conditioning image), the rest at t. Its blocks then modulate per token."""
    from diffusers import WanTransformer3DModel

    model, kwargs = wan_like(WanTransformer3DModel, dict(in_channels=48, out_channels=48, num_attention_heads=24,
                                                         ffn_dim=14336, num_layers=30), (31, 44, 80, 512),
                             size, dtype, device)
    pf, ph, pw = model.config.patch_size
    _, _, frames, height, width = kwargs["hidden_states"].shape
    per_frame = (height // ph) * (width // pw)
    timestep = torch.full((1, frames // pf * per_frame), 500.0, device=kwargs["hidden_states"].device)
    timestep[:, :per_frame] = 0.0
    return model, dict(kwargs, timestep=timestep)


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


def _latte(size, dtype, device):
    from diffusers import LatteTransformer3DModel

    # num_layers spatial blocks (with cross-attention) interleaved with num_layers temporal blocks
    if size == "tiny":
        cfg = dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2,
                   caption_channels=16, in_channels=4, cross_attention_dim=16, out_channels=8, attention_bias=True,
                   activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
                   norm_elementwise_affine=False, norm_eps=1e-6, video_length=2)
        batch, frames, latent, text = 2, 2, 8, 6
    else:  # Latte-1 at 512x512 x 16 frames: 16 x 64 x 64 latent, patch 2 -> 1024 tokens a frame, 120 T5 tokens
        cfg = dict(sample_size=64, num_layers=28, patch_size=2, attention_head_dim=72, num_attention_heads=16,
                   caption_channels=4096, in_channels=4, cross_attention_dim=1152, out_channels=8, attention_bias=True,
                   activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
                   norm_elementwise_affine=False, norm_eps=1e-6, video_length=16)
        batch, frames, latent, text = 2, 16, 64, 120
    # blocks2: one spatial + one temporal block (_two_blocks would make num_layers=2, i.e. four blocks)
    model = _model(LatteTransformer3DModel, dict(cfg, num_layers=1) if size == "blocks2" else cfg,
                   "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, frames, latent, latent, g=g),
        timestep=torch.full((batch,), 500, dtype=torch.long),
        encoder_hidden_states=_randn(batch, text, c.caption_channels, g=g),
        enable_temporal_attentions=True,
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _skyreels_v2(size, dtype, device):
    from diffusers import SkyReelsV2Transformer3DModel

    # Wan's blocks; the text-to-video path (one timestep per sample, no diffusion forcing, no fps).
    # SkyReels-V2-T2V-14B-540P, 960x544 x 97 frames: 25 x 68 x 120 latent, 512 text tokens
    return wan_like(SkyReelsV2Transformer3DModel, dict(num_attention_heads=40, ffn_dim=13824, num_layers=40),
                    (25, 68, 120, 512), size, dtype, device)


def _allegro(size, dtype, device):
    from diffusers import AllegroTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    if size == "tiny":  # head dim 12: the RoPE rotates thirds of it (t, h, w), 4 channels each
        cfg = dict(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=1,
                   cross_attention_dim=24, sample_width=8, sample_height=8, sample_frames=2, caption_channels=16)
        frames, h, w, text = 2, 8, 8, 6
    else:  # Allegro, 1280x720 x 88 frames: 22 x 90 x 160 latent, 512 text tokens
        cfg, (frames, h, w, text) = dict(), (22, 90, 160, 512)
    model = _model(AllegroTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the RoPE tables and token positions as AllegroPipeline._prepare_rotary_positional_embeddings makes them
    gh, gw = h // c.patch_size, w // c.patch_size
    *freqs, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=c.attention_head_dim, crops_coords=((0, 0), (gh, gw)), grid_size=(gh, gw), temporal_size=frames,
        interpolation_scale=(c.interpolation_scale_t, c.interpolation_scale_h, c.interpolation_scale_w),
        device=device)
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long()).reshape(-1, 3).transpose(0, 1)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g),
                  encoder_hidden_states=_randn(1, text, c.caption_channels, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long), encoder_attention_mask=torch.ones(1, text),
                  image_rotary_emb=(tuple(freqs), tuple(pos.reshape(3, 1, -1).contiguous())), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _sanavideo(size, dtype, device):
    from diffusers import SanaVideoTransformer3DModel

    # Sana's linear attention (ReLU kernel, Wan's even/odd RoPE on q and k) and GLUMBConv with a temporal conv,
    # a softmax cross-attention to the Gemma-2 caption; head dim 12 at tiny: Wan's RoPE splits it t/h/w 4/4/4
    if size == "tiny":
        cfg = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                   num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24,
                   caption_channels=16, sample_size=8, patch_size=(1, 2, 2), rope_max_seq_len=32)
        batch, frames, height, width, text = 2, 2, 8, 8, 6
    else:  # SANA-Video 2B 480p, 832x480 x 81 frames: 21 x 60 x 104 latent (Wan VAE), patch (1, 2, 2), 300 tokens
        cfg = dict(mlp_ratio=3.0)  # scripts/convert_sana_video_to_diffusers.py: the class defaults but mlp_ratio
        batch, frames, height, width, text = 2, 21, 60, 104, 300
    model = _model(SanaVideoTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, frames, height, width, g=g),
        encoder_hidden_states=_randn(batch, text, c.caption_channels, g=g),
        timestep=torch.full((batch,), 500.0),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _wan_vace(size, dtype, device):
    from diffusers import WanVACETransformer3DModel

    # Wan's blocks, and VACE blocks (Wan's, plus proj_in / proj_out) over the control latents whose
    # outputs are added after the Wan blocks named in vace_layers; one of each kind at tiny
    if size == "tiny":
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                   out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
                   vace_layers=[0], vace_in_channels=12)
        batch, frames, height, width, text = 1, 2, 4, 4, 6
    else:  # Wan2.1-VACE-1.3B, 480p, 81 frames: 21x60x104 latent; 96 control channels (16 + 16 + a 64-channel mask)
        cfg = dict(num_attention_heads=12, ffn_dim=8960, num_layers=30, vace_layers=list(range(0, 30, 2)))
        batch, frames, height, width, text = 1, 21, 60, 104, 512
    if size == "blocks2":  # one Wan block + one VACE block (_two_blocks would make num_layers 2 beside the VACE blocks)
        cfg.update(num_layers=1, vace_layers=[0])
    model = _model(WanVACETransformer3DModel, cfg, "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, frames, height, width, g=g),
        timestep=torch.full((batch,), 500.0),
        encoder_hidden_states=_randn(batch, text, c.text_dim, g=g),
        control_hidden_states=_randn(batch, c.vace_in_channels, frames, height, width, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _easyanimate(size, dtype, device):
    from diffusers import EasyAnimateTransformer3DModel

    # num_layers blocks, the first mmdit_layers of them MMDiT (added text QKV, to_add_out, a text FF), the rest
    # image-only (text and image tokens concatenated before one QKV, one FF for both streams); V5.1 puts a
    # caption RMSNorm before text_proj (add_norm_text_encoder)
    if size == "tiny":  # 1 MMDiT + 1 image-only block; head dim 16: the 3D RoPE takes 4 (t) + 6 (h) + 6 (w)
        cfg = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=2,
                   num_layers=2, mmdit_layers=1, time_embed_dim=8, text_embed_dim=16, add_norm_text_encoder=True)
        frames, h, w, text = 2, 8, 8, 6
    else:  # EasyAnimateV5.1-7b-zh, 512x512 x 49 frames: 13 x 64 x 64 latent, 256 Qwen2-VL tokens
        cfg = dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16, patch_size=2,
                   num_layers=36, mmdit_layers=18, text_embed_dim=3584, add_norm_text_encoder=True)
        if size == "blocks2":  # _two_blocks cuts num_layers, not mmdit_layers: one block of each kind
            cfg.update(num_layers=2, mmdit_layers=1)
        frames, h, w, text = 13, 64, 64, 256
    model = _model(EasyAnimateTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g),
                  timestep=torch.full((1,), 500.0),  # the pipeline's t_expand: the flow-matching t, latents' dtype
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g), return_dict=False)
    return _place(model, kwargs, dtype, device)


MODELS: Dict[str, ModelCase] = {
    "wan": ModelCase("wan", _wan, "WanTransformer3DModel (tiny: 1 layer)"),
    "wan22_ti2v": ModelCase("wan22_ti2v", _wan22_ti2v, "WanTransformer3DModel as Wan 2.2 TI2V 5B, a timestep per "
                            "token (tiny: 1 layer)"),
    "cogvideox": ModelCase("cogvideox", _cogvideox, "CogVideoXTransformer3DModel (tiny: 1 layer)"),
    "ltx": ModelCase("ltx", _ltx, "LTXVideoTransformer3DModel (tiny: 1 layer)"),
    "hunyuanvideo": ModelCase("hunyuanvideo", _hunyuanvideo, "HunyuanVideoTransformer3DModel (tiny: 1 double + 1 "
                              "single block, 1 token-refiner layer)"),
    "latte": ModelCase("latte", _latte, "LatteTransformer3DModel (tiny: 1 spatial + 1 temporal block)"),
    "skyreels_v2": ModelCase("skyreels_v2", _skyreels_v2, "SkyReelsV2Transformer3DModel (tiny: 1 layer; Wan's blocks, "
                             "text-to-video)"),
    "allegro": ModelCase("allegro", _allegro, "AllegroTransformer3DModel (tiny: 1 layer, the pipeline's RoPE tables)"),
    "sanavideo": ModelCase("sanavideo", _sanavideo, "SanaVideoTransformer3DModel (tiny: 1 layer)"),
    "wan_vace": ModelCase("wan_vace", _wan_vace, "WanVACETransformer3DModel (tiny: 1 Wan block + 1 VACE block)"),
    "easyanimate": ModelCase("easyanimate", _easyanimate, "EasyAnimateTransformer3DModel, V5.1 (tiny: 1 MMDiT + 1 "
                             "image-only block)"),
}
