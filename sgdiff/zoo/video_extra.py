"""Video DiTs whose forward breaks the graph or packs history latents: Mochi, HunyuanVideo 1.5, FramePack, Helios,
Kandinsky 6 SR, ConsisID (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ModelCase, _gen, _model, _place, _randn
from sgdiff.zoo.video_more import _mask


def _mochi(size, dtype, device):
    from diffusers import MochiTransformer3DModel

    # asymmetric joint attention (a wide video stream, a narrow text stream of pooled_projection_dim), Mochi's
    # RMSNorm-zero modulation with tanh gates, SwiGLU; the last block is context_pre_only (its text stream stops
    # after attention): two kinds of block. The attention keeps each sample's valid text tokens (torch.nonzero of
    # the mask); the RoPE is per head, from the learned pos_frequencies
    if size == "tiny":  # the diffusers test's config: 2 layers, one of each kind
        cfg = dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
                   in_channels=4, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4, activation_fn="swiglu",
                   max_sequence_length=16)
        frames, h, w, (text, valid) = 2, 16, 16, (16, 12)
    else:  # genmo/mochi-1-preview (the class defaults: 48 layers, 24 x 128 wide), the pipeline's 848x480 x 19
        # frames: 4 x 60 x 106 latent (8x spatial, 6x temporal, 12 channels), 256 T5 tokens (padded)
        cfg = dict()
        frames, h, w, (text, valid) = 4, 60, 106, (256, 64)
    model = _model(MochiTransformer3DModel, cfg, size)
    with torch.no_grad():  # trained RoPE frequencies (initialised at 0.0: every rotation would be the identity)
        torch.nn.init.normal_(model.pos_frequencies, std=0.1)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g), timestep=torch.full((1,), 500.0),
                  encoder_attention_mask=_mask(text, valid).bool(), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _hunyuanvideo15(size, dtype, device):
    from diffusers import HunyuanVideo15Transformer3DModel

    # dual-stream blocks only (AdaLayerNormZero on video and text, joint attention with QK RMSNorm, RoPE on the
    # video tokens); the text is a token-refined Qwen2.5-VL stream, a ByT5 glyph stream and SigLIP image tokens,
    # reordered valid-first per sample by their masks. Text-to-video as the pipeline runs it: latents | zero
    # condition latents | zero mask channel, the image tokens zeros, no glyph text (ByT5 embeddings and mask zeros)
    if size == "tiny":  # the diffusers test's widths, 1 block, 1 refiner layer; 4 + 4 + 1 input channels
        cfg = dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                   num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
                   text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v")
        frames, h, w, (text, valid), glyph, image = 1, 8, 8, (6, 4), 4, 3
    else:  # HunyuanVideo-1.5 480p T2V (scripts/convert_hunyuan_video1_5_to_diffusers.py's 480p_t2v: 54 blocks,
        # 16 x 128 wide, 65 input channels), the pipeline's 848x480 x 121 frames: 31 x 30 x 53 latent (16x spatial,
        # 4x temporal), 1000 Qwen2.5-VL tokens (padded), 256 ByT5 tokens, 729 SigLIP tokens
        cfg = dict(task_type="t2v")
        frames, h, w, (text, valid), glyph, image = 31, 30, 53, (1000, 128), 256, 729
    model = _model(HunyuanVideo15Transformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    latent = c.out_channels
    hidden = torch.cat([_randn(1, latent, frames, h, w, g=g),
                        torch.zeros(1, c.in_channels - latent, frames, h, w, device="cpu")], 1)
    kwargs = dict(hidden_states=hidden, timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  encoder_attention_mask=_mask(text, valid).float(),  # the pipeline casts its masks to the dtype
                  encoder_hidden_states_2=torch.zeros(1, glyph, c.text_embed_2_dim, device="cpu"),
                  encoder_attention_mask_2=torch.zeros(1, glyph, device="cpu"),
                  image_embeds=torch.zeros(1, image, c.image_embed_dim, device="cpu"), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _framepack_indices(window: int, history=(1, 2, 16)):
    """HunyuanVideoFramepackPipeline's frame indices (inverted anti-drifting, the last section: no padding):
    the noisy window, the clean frames (the image's and the 1x history's), the 2x and 4x history."""
    idx = torch.arange(0, 1 + window + sum(history))
    prefix, latents, h1, h2, h4 = idx.split([1, window, *history])
    return latents, torch.cat([prefix, h1]), h2, h4


def _framepack(size, dtype, device):
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    # HunyuanVideo's dual- and single-stream blocks over the noisy window packed after its history: the clean
    # frames (1x patches), 2x and 4x downsampled history (clean_x_embedder's 3D convs), each with RoPE at its frame
    # indices; SigLIP image tokens projected and put before the text; batch 1 keeps the valid text tokens only
    if size == "tiny":  # the diffusers test's config (1 double + 1 single block, 1 refiner layer); the pipeline's
        # history sizes (1, 2, 16) around a 3-frame window
        cfg = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                   num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
                   text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None,
                   has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True)
        window, h, w, (text, valid), image = 3, 8, 8, (12, 8), 12
    else:  # lllyasviel/FramePackI2V_HY (HunyuanVideo's widths: 20 double + 40 single blocks, 24 x 128; has_image_proj,
        # image_proj_dim 1152, has_clean_x_embedder), the pipeline's 1280x720, latent_window_size 9: a 9 x 90 x 160
        # window, 256 Llama tokens (padded), CLIP-L pooled 768, 729 SigLIP tokens
        cfg = dict(has_image_proj=True, image_proj_dim=1152, has_clean_x_embedder=True)
        window, h, w, (text, valid), image = 9, 90, 160, (256, 64), 729
    model = _model(HunyuanVideoFramepackTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    latents, clean, h2, h4 = _framepack_indices(window)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, window, h, w, g=g), timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  encoder_attention_mask=_mask(text, valid).float(),  # the pipeline's mask, in the dtype
                  pooled_projections=_randn(1, c.pooled_projection_dim, g=g),
                  image_embeds=_randn(1, image, c.image_proj_dim, g=g), indices_latents=latents,
                  guidance=torch.full((1,), 6000.0),  # guidance_scale 6.0 * 1000
                  latents_clean=_randn(1, c.in_channels, len(clean), h, w, g=g), indices_latents_clean=clean,
                  latents_history_2x=_randn(1, c.in_channels, len(h2), h, w, g=g), indices_latents_history_2x=h2,
                  latents_history_4x=_randn(1, c.in_channels, len(h4), h, w, g=g), indices_latents_history_4x=h4,
                  return_dict=False)
    return _place(model, kwargs, dtype, device)


def _helios_indices(chunk: int, history=(16, 2, 1)):
    """HeliosPipeline's frame indices (keep_first_frame): the chunk's, and the short (first frame + 1x),
    mid and long history's, each [1, n]."""
    idx = torch.arange(0, 1 + sum(history) + chunk)
    prefix, long, mid, h1, hidden = idx.split([1, *history, chunk])
    return hidden[None], torch.cat([prefix, h1])[None], mid[None], long[None]


def _helios(size, dtype, device):
    from diffusers import HeliosTransformer3DModel

    # Wan's blocks (self-attention with QK RMSNorm across heads and RoPE, text cross-attention, FFN, an adaLN table
    # per block) over the chunk packed after its long / mid / short history (patch_long / patch_mid / patch_short,
    # RoPE at their frame indices, pooled for the coarser ones); the history at timestep 0 (zero_history_timestep),
    # the cross-attention on the chunk only (guidance_cross_attn)
    if size == "tiny":  # the diffusers test's config, 1 layer; the pipeline's history sizes (16, 2, 1)
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                   text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4), has_multi_term_memory_patch=True,
                   guidance_cross_attn=True, zero_history_timestep=True, is_amplify_history=False)
        chunk, h, w, text = 2, 16, 16, 12
    else:  # Helios-Base (the class defaults: Wan 2.1 14B's widths, 40 layers; multi-term memory patches, zero history
        # timestep, guidance cross-attention), the pipeline's 640x384, 9 latent frames a chunk: 48 x 80 latent (Wan
        # VAE), 512 umT5 tokens
        cfg = dict()
        chunk, h, w, text = 9, 48, 80, 512
    model = _model(HeliosTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    hidden, short, mid, long = _helios_indices(chunk)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, chunk, h, w, g=g), timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_dim, g=g), indices_hidden_states=hidden,
                  indices_latents_history_short=short, indices_latents_history_mid=mid,
                  indices_latents_history_long=long,
                  latents_history_short=_randn(1, c.in_channels, short.shape[1], h, w, g=g),
                  latents_history_mid=_randn(1, c.in_channels, mid.shape[1], h, w, g=g),
                  latents_history_long=_randn(1, c.in_channels, long.shape[1], h, w, g=g), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _kandinsky6_sr(size, dtype, device):
    from diffusers import Kandinsky6SRTransformer3DModel

    # text-free: adaLN-modulated self-attention (QK RMSNorm, Kandinsky's rotation-matrix RoPE, NABLA sparse
    # attention through flex attention over 8x8 token blocks) + GELU FF blocks, fp32 scale/shift and gates; input
    # [latent | anchor latent | anchor mask] channels-last, the anchor zeros as the pipeline passes it
    if size == "tiny":  # the diffusers test's config, 1 block: a 2 x 8 x 8 token grid
        cfg = dict(in_visual_dim=4, out_visual_dim=8, time_dim=16, patch_size=(1, 2, 2), model_dim=24, ff_dim=32,
                   num_visual_blocks=1, axes_dims=(4, 4, 4))
        frames, h, w = 2, 16, 16
    else:  # Kandinsky-6.0-VSR distilled (the class defaults: 32 blocks, 1792 wide, 64 K-VAE channels, 640 output
        # channels for the Piflow scheduler), one 512x768 tile of a 121-frame video: 31 x 32 x 48 latent (K-VAE 16x
        # spatial, 4x temporal)
        cfg = dict()
        frames, h, w = 31, 32, 48
        if size == "blocks2":  # _two_blocks knows num_layers, not num_visual_blocks; 4 latent frames, as eager's
            # flex attention materializes its scores (236 GB at 31 frames)
            cfg.update(num_visual_blocks=2)
            frames = 4
    model = _model(Kandinsky6SRTransformer3DModel, cfg, "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    latents = _randn(1, frames, h, w, c.in_visual_dim, g=g)
    anchor, anchor_mask = torch.zeros_like(latents), torch.zeros(1, frames, h, w, 1, device="cpu")
    kwargs = dict(hidden_states=torch.cat([latents, anchor, anchor_mask], -1),
                  timestep=torch.full((1,), 500.0), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _consisid(size, dtype, device):
    from diffusers import ConsisIDTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.consisid.pipeline_consisid import get_resize_crop_region_for_grid

    # CogVideoX-5B I2V's blocks (text and video tokens through one attention, CogVideoXLayerNormZero gates, RoPE on
    # the video tokens) with face injection: a local facial extractor (perceiver over the face ViT's hidden states
    # and the ID embedding) and a perceiver cross-attention added after every cross_attn_interval-th block; input
    # [noisy latents | image latents], frames first
    if size == "tiny":  # the diffusers test's face modules and widths, 1 block + its face cross-attention; RoPE and
        # learned positional embeddings as the full config (head dim 16: the 3D RoPE's 4 + 6 + 6; 3 heads, so that
        # the face tokens' width LFE_output_dim is the blocks' 2 / 3, 32, as 2048 is 3072's)
        cfg = dict(num_attention_heads=3, attention_head_dim=16, in_channels=8, out_channels=4, time_embed_dim=2,
                   text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
                   temporal_compression_ratio=4, max_text_seq_length=8, use_rotary_positional_embeddings=True,
                   use_learned_positional_embeddings=True, cross_attn_interval=1, is_kps=False, is_train_face=True,
                   cross_attn_dim_head=1, cross_attn_num_heads=1, LFE_id_dim=2, LFE_vit_dim=2, LFE_depth=5,
                   LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=1, LFE_num_querie=1, LFE_output_dim=32,
                   LFE_ff_mult=1, LFE_num_scale=1)
        frames, h, w, text, vit_tokens = 2, 8, 8, 8, 2
    else:  # BestWishYsh/ConsisID-preview: CogVideoX-5B I2V's transformer (42 layers, 48 x 64 wide, 32 input channels,
        # RoPE + learned positional embeddings) with the face modules at the class defaults (cross-attention every
        # 2nd block, no keypoints); the pipeline's 720x480 x 49 frames: 13 x 60 x 90 latent, 226 T5 tokens; the face
        # ViT (EVA02-CLIP-L-14-336) gives 5 hidden states of 577 tokens, the ID embedding is 512 + 768
        cfg = dict(num_attention_heads=48, attention_head_dim=64, in_channels=32, out_channels=16, num_layers=42,
                   use_rotary_positional_embeddings=True, use_learned_positional_embeddings=True, is_train_face=True,
                   is_kps=False, cross_attn_interval=2)
        if size == "blocks2":  # one block + its face cross-attention (_two_blocks: 2 blocks and 1 cross-attention;
            # at 1 layer an interval of 2 leaves no cross-attention: num_layers // cross_attn_interval)
            cfg.update(num_layers=1, cross_attn_interval=1)
        frames, h, w, text, vit_tokens = 13, 60, 90, 226, 577
    model = _model(ConsisIDTransformer3DModel, cfg, "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    # the pipeline's _prepare_rotary_positional_embeddings
    gh, gw = h // c.patch_size, w // c.patch_size
    crops = get_resize_crop_region_for_grid((gh, gw), c.sample_width // c.patch_size, c.sample_height // c.patch_size)
    cos, sin = get_3d_rotary_pos_embed(embed_dim=c.attention_head_dim, crops_coords=crops, grid_size=(gh, gw),
                                       temporal_size=frames, device="cpu")
    kwargs = dict(hidden_states=_randn(1, frames, c.in_channels, h, w, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  timestep=torch.full((1,), 500, dtype=torch.long), image_rotary_emb=(cos, sin),
                  id_cond=_randn(1, c.LFE_id_dim, g=g), return_dict=False)
    model, kwargs = _place(model, kwargs, dtype, device)
    cos, sin = kwargs["image_rotary_emb"]  # the pipeline's tables: fp32, on the device
    kwargs["image_rotary_emb"] = (cos.to(device), sin.to(device))
    kwargs["id_vit_hidden"] = [_randn(1, vit_tokens, c.LFE_vit_dim, g=g).to(device, dtype)
                               for _ in range(c.LFE_num_scale)]
    return model, kwargs


#: Mochi, HunyuanVideo 1.5, FramePack, Helios and Kandinsky 6 SR do not run on the meta device (autocast has no
#: 'meta' device type; .item() of a meta tensor; flex attention refuses it)
MODELS: Dict[str, ModelCase] = {
    "mochi": ModelCase("mochi", _mochi, "MochiTransformer3DModel, Mochi 1 (tiny: 2 layers, the last text-stops-after-"
                       "attention)", meta=False),
    "hunyuanvideo15": ModelCase("hunyuanvideo15", _hunyuanvideo15, "HunyuanVideo15Transformer3DModel, 480p T2V "
                                "(tiny: 1 block, 1 refiner layer)", meta=False),
    "framepack": ModelCase("framepack", _framepack, "HunyuanVideoFramepackTransformer3DModel, FramePack I2V (tiny: 1 "
                           "double + 1 single block, 1 refiner layer)", meta=False),
    "helios": ModelCase("helios", _helios, "HeliosTransformer3DModel (tiny: 1 layer, short / mid / long history)",
                        meta=False),
    "kandinsky6_sr": ModelCase("kandinsky6_sr", _kandinsky6_sr, "Kandinsky6SRTransformer3DModel, the VSR model (tiny: "
                               "1 block)", meta=False,
                               fewer_tokens="eager's flex attention materializes its scores: 236 GB at 31 frames"),
    "consisid": ModelCase("consisid", _consisid, "ConsisIDTransformer3DModel (tiny: 1 block + its face "
                          "cross-attention)"),
}
