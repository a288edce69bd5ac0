"""More video DiTs: ChronoEdit, Cosmos-Predict2.5, LTX-2, Motif-Video, MiniMax H3, Kandinsky 5 and 6, Wan-Animate
and Wan-Animate 2, AnyFlow and AnyFlow-FAR (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ListDiT, ModelCase, _gen, _model, _place, _randn


def _chronoedit(size, dtype, device):
    from diffusers import ChronoEditTransformer3DModel

    # Wan 2.1 I2V blocks (the image-embedding cross-attention: add_k_proj / add_v_proj over CLIP tokens), a RoPE that
    # takes frames 0 and temporal_skip_len - 1 of its table when there are two latent frames (the edit's two frames)
    if size == "tiny":
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=8, out_channels=4,
                   text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, image_dim=8, added_kv_proj_dim=24,
                   rope_max_seq_len=32)
        frames, height, width, text, image = 2, 4, 4, 6, 5
    else:  # nvidia/ChronoEdit-14B-Diffusers (Wan2.1-I2V-14B-720P's config), 1280x720 edit: 2 x 90 x 160 latent,
        # 36 channels (16 noisy + 4 mask + 16 image), 512 umT5 tokens, 257 CLIP tokens
        cfg = dict(in_channels=36, image_dim=1280, added_kv_proj_dim=5120)
        frames, height, width, text, image = 2, 90, 160, 512, 257
    model = _model(ChronoEditTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, height, width, g=g),
                  timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
                  encoder_hidden_states_image=_randn(1, image, c.image_dim, g=g), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _ltx2(size, dtype, device):
    from diffusers import LTX2VideoTransformer3DModel

    # joint audio-video blocks: video and audio self-attention, text cross-attention, audio-to-video and
    # video-to-audio cross-attention, feed-forwards, each stream modulated by adaLN-single tables
    if size == "tiny":  # the diffusers test's widths
        cfg = dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
                   attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
                   audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1,
                   caption_channels=16, rope_double_precision=False)
        frames, h, w, audio_frames, text = 2, 4, 4, 9, 6
    else:  # LTX-2 19B (the class defaults), the pipeline's 768x512 x 121 frames at 24 fps: 16 x 16 x 24 latent,
        # 126 audio latent frames (5.04 s at 25 a second, 8 channels x 16 mel bins), 1024 Gemma-3 tokens
        cfg = dict()
        frames, h, w, audio_frames, text = 16, 16, 24, 126, 1024
    model = _model(LTX2VideoTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    t = torch.full((1,), 500.0)  # the pipeline's t.expand(batch), passed as timestep and sigma
    kwargs = dict(hidden_states=_randn(1, frames * h * w, c.in_channels, g=g),
                  audio_hidden_states=_randn(1, audio_frames, c.audio_in_channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.caption_channels, g=g),
                  audio_encoder_hidden_states=_randn(1, text, c.caption_channels, g=g), timestep=t, sigma=t,
                  encoder_attention_mask=torch.ones(1, text, dtype=torch.long),
                  audio_encoder_attention_mask=torch.ones(1, text, dtype=torch.long), num_frames=frames, height=h,
                  width=w, fps=24.0, audio_num_frames=audio_frames, return_dict=False)
    return _place(model, kwargs, dtype, device)


def _cosmos(size, dtype, device):
    from diffusers import CosmosTransformer3DModel

    # Cosmos-Predict2.5 (Cosmos2_5_PredictBasePipeline): the text context through crossattn_proj (Linear + GELU),
    # per-frame timesteps [B, 1, T, 1, 1] (the conditioning frame at 0.0001), the condition mask as a channel. The
    # padding-mask channel (concat_padding_mask) needs torchvision's resize, which the zoo does without: the model
    # takes it as a second condition_mask channel instead (the pipeline's padding mask is zeros; the resize of zeros
    # is zeros), concat_padding_mask=False with in_channels 16 + 1 + 1: the same patch_embed and the same tokens
    if size == "tiny":
        cfg = dict(in_channels=4 + 2, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                   mlp_ratio=2.0, text_embed_dim=16, adaln_lora_dim=8, max_size=(8, 16, 16), patch_size=(1, 2, 2),
                   rope_scale=(1.0, 3.0, 3.0), concat_padding_mask=False, extra_pos_embed_type=None,
                   use_crossattn_projection=True, crossattn_proj_in_channels=32, encoder_hidden_states_channels=16)
        frames, h, w, text = 2, 8, 8, 6
    else:  # Cosmos-Predict2.5-2B (scripts/convert_cosmos_to_diffusers.py), the pipeline's 1280x704 x 93 frames:
        # 24 x 88 x 160 latent (Wan 2.1 VAE), 512 Qwen2.5-VL tokens of 100352 channels (all layers' states)
        cfg = dict(in_channels=16 + 2, out_channels=16, num_attention_heads=16, attention_head_dim=128, num_layers=28,
                   mlp_ratio=4.0, text_embed_dim=1024, adaln_lora_dim=256, max_size=(128, 240, 240),
                   patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0), concat_padding_mask=False,
                   extra_pos_embed_type=None, use_crossattn_projection=True, crossattn_proj_in_channels=100352,
                   encoder_hidden_states_channels=1024)
        frames, h, w, text = 24, 88, 160, 512
    model = _model(CosmosTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    cond = torch.zeros(1, 1, frames, 1, 1)
    cond[:, :, :1] = 1.0  # one conditioning latent frame
    t = cond * 0.0001 + (1 - cond) * 0.5
    masks = torch.cat([cond.expand(-1, -1, -1, h, w), torch.zeros(1, 1, frames, h, w)], dim=1)
    kwargs = dict(hidden_states=_randn(1, c.in_channels - 2, frames, h, w, g=g), condition_mask=masks, timestep=t,
                  encoder_hidden_states=_randn(1, text, c.crossattn_proj_in_channels, g=g), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _motif_video(size, dtype, device):
    from diffusers import MotifVideoTransformer3DModel

    # Flux-like: dual-stream blocks (AdaLayerNormZero on image and text) then single-stream blocks
    # (AdaLayerNormZeroSingle, attention and GELU-tanh MLP side by side); latents | condition | mask channels
    if size == "tiny":
        cfg = dict(in_channels=4 + 4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                   num_single_layers=1, mlp_ratio=2.0, patch_size=2, text_embed_dim=16, rope_axes_dim=(4, 6, 6))
        frames, h, w, text = 2, 8, 8, 6
    else:  # Motif-Video (the class defaults: 20 dual + 40 single blocks, 3072 wide), the pipeline's 1280x736 x 121
        # frames: 31 x 92 x 160 latent (Wan 2.1 VAE), 512 T5Gemma2 tokens
        cfg = dict()
        frames, h, w, text = 31, 92, 160, 512
    model = _model(MotifVideoTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g), timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
                  encoder_attention_mask=torch.ones(1, text, dtype=torch.long), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _minimax_h3(size, dtype, device):
    from diffusers import MiniMaxH3Transformer3DModel

    # one packed sequence (text, audio, video rows, as the diffusers test packs it): refiner blocks on the text,
    # then self-attention-only blocks whose adaLN rows are chosen per token by (timestep, modality)
    if size == "tiny":  # the diffusers test's widths (heads * head_dim 32 != hidden 24, partial rotary)
        cfg = dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=1, num_refiner_layers=1,
                   ffn_dim=32, in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2), text_dim=8, freq_dim=8,
                   time_embed_hidden_dim=24, time_embed_dim=16, rope_freq_dim=2)
        (frames, h, w), audio, text = (2, 2, 2), 6, 4
    else:  # MiniMax-H3 (the class defaults); diffusers 0.42.1 ships no pipeline: a 21 x 30 x 52 token video
        # (480x832 x 81 frames at 16x spatial, 4x temporal compression), 126 audio rows, 512 text tokens
        cfg = dict()
        (frames, h, w), audio, text = (21, 30, 52), 126, 512
    model = _model(MiniMaxH3Transformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    video = frames * h * w
    n = text + audio + video
    text_idx, audio_idx, video_idx = torch.arange(text), torch.arange(text, text + audio), torch.arange(text + audio, n)
    tags = torch.zeros(n, dtype=torch.long)
    tags[text_idx], tags[audio_idx] = 1, 2
    t_idx = torch.zeros(n, dtype=torch.long)
    t_idx[audio_idx] = 1  # audio steps down a schedule of its own
    pos = torch.zeros(n, 3)
    pos[:, 0] = torch.arange(n).float()
    grid = torch.stack(torch.meshgrid(torch.arange(frames), torch.arange(h), torch.arange(w), indexing="ij"), -1)
    pos[video_idx] = grid.reshape(-1, 3).float() + torch.tensor([text + audio, 0.0, 0.0])
    kwargs = dict(hidden_states=_randn(1, video, c.in_channels * 4, g=g),
                  audio_hidden_states=_randn(1, audio, c.audio_in_channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.text_dim, g=g), timestep=torch.tensor([0.7, 0.3]),
                  timestep_indices=t_idx, token_tags=tags, position_ids=pos, video_indices=video_idx,
                  audio_indices=audio_idx, text_indices=text_idx, return_dict=False)
    return _place(model, kwargs, dtype, device)


def _mask(n: int, valid: int) -> torch.Tensor:
    """A tokenizer's padded attention mask: ``valid`` ones, then zeros, [1, n] (int64)."""
    return (torch.arange(n) < valid).long()[None]


def _modulated(model):
    """Kandinsky's Modulation layers start at zero (every gate, scale and shift 0: the blocks would add nothing);
    random ones, as a trained checkpoint has, so that each block's chains reach the output."""
    for name, m in model.named_modules():
        if type(m).__name__.endswith("Modulation"):
            torch.nn.init.normal_(m.out_layer.weight, std=0.1)
            torch.nn.init.normal_(m.out_layer.bias, std=0.1)
    return model


def _kandinsky5(size, dtype, device):
    from diffusers import Kandinsky5Transformer3DModel

    # num_text_blocks encoder blocks (text self-attention) then num_visual_blocks decoder blocks (self-attention,
    # cross-attention to the text, FF); latents channels-last [B, T, H, W, C], with visual_cond the pipeline's cat
    # of noise, (zero) condition latents and a mask channel
    if size == "tiny":  # head dim 16 = the RoPE's axes 4 + 6 + 6
        cfg = dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, model_dim=32,
                   ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 6, 6), visual_cond=True)
        frames, h, w, text = 2, 4, 4, 6
    else:  # Kandinsky 5.0 T2V Lite sft 5s (kandinsky-5's get_default_conf: model_dim 1792, ff_dim 7168, 2 + 32
        # blocks, visual_cond), the pipeline's default 768x512 x 121 frames: 31 x 64 x 96 latent; 256 Qwen tokens
        cfg = dict(in_visual_dim=16, out_visual_dim=16, model_dim=1792, ff_dim=7168, num_text_blocks=2,
                   num_visual_blocks=32, visual_cond=True)
        if size == "blocks2":  # _two_blocks knows num_layers, not Kandinsky's names: one block of each kind
            cfg.update(num_text_blocks=1, num_visual_blocks=1)
        frames, h, w, text = 31, 64, 96, 256
    model = _modulated(_model(Kandinsky5Transformer3DModel, cfg, size))
    c = model.config
    g = _gen(device)
    channels = 2 * c.in_visual_dim + 1 if c.visual_cond else c.in_visual_dim
    p = c.patch_size
    kwargs = dict(hidden_states=_randn(1, frames, h, w, channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.in_text_dim, g=g), timestep=torch.full((1,), 500.0),
                  pooled_projections=_randn(1, c.in_text_dim2, g=g),
                  # the pipeline's RoPE positions: latent frames, patched rows and columns; text tokens
                  visual_rope_pos=[torch.arange(frames // p[0]), torch.arange(h // p[1]), torch.arange(w // p[2])],
                  text_rope_pos=torch.arange(text), scale_factor=(1, 2, 2),  # _get_scale_factor at 480p-854p
                  return_dict=True)  # as the pipeline calls it; out[0] is .sample (return_dict=False gives no tuple)
    return _place(model, kwargs, dtype, device)


def _kandinsky6(size, dtype, device):
    from diffusers.models.transformers.transformer_kandinsky6 import Kandinsky6Transformer3DModel

    # video and audio denoised together: two text branches (video's, audio's: num_text_blocks encoder blocks each),
    # then num_visual_blocks fused blocks (video and audio self-attention, cross-attention to their text, video <->
    # audio cross-attention, FFs); the released flags (ca_rope, cross_gates, fix_modulation); text-to-video+audio
    if size == "tiny":  # head dims 16 = the RoPE's axes 4 + 6 + 6; an audio stream narrower than the video's
        cfg = dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, model_dim=32,
                   ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 6, 6), in_audio_dim=4,
                   out_audio_dim=4, model_dim_a=16, time_dim_a=16, ff_dim_a=32, axes_dims_a=(4, 6, 6),
                   audio_freqs_scaling=0.144, text_token_padding=True, ca_rope=True, cross_gates=True,
                   fix_modulation=True, visual_token_type_num_embeddings=2)
        frames, h, w, audio, (text, valid) = 2, 4, 4, 5, (6, 4)
    else:  # Kandinsky 6 Lite TI2VA (its transformer/config.json), the pipeline's default 768x512 x 121 frames at
        # 24 fps: 31 x 64 x 96 latent, ceil(121 / 24 * 44100 / 1024) = 218 audio latents, 1024 Qwen tokens (padded)
        cfg = dict(in_visual_dim=16, out_visual_dim=16, time_dim=512, model_dim=1792, ff_dim=7168, num_text_blocks=2,
                   num_visual_blocks=32, axes_dims=(16, 24, 24), in_audio_dim=40, out_audio_dim=40, model_dim_a=896,
                   time_dim_a=512, ff_dim_a=3584, axes_dims_a=(16, 24, 24), audio_freqs_scaling=0.144,
                   text_token_padding=True, ca_rope=True, cross_gates=True, fix_modulation=True,
                   visual_token_type_num_embeddings=2)
        if size == "blocks2":  # one text block a branch (video's, audio's) and one fused block
            cfg.update(num_text_blocks=1, num_visual_blocks=1)
        frames, h, w, audio, (text, valid) = 31, 64, 96, 218, (1024, 128)
    model = _model(Kandinsky6Transformer3DModel, cfg, "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, frames, h, w, 2 * c.in_visual_dim + 1, g=g),  # [noise | cond | mask]
                  encoder_hidden_states=_randn(1, text, c.in_text_dim, g=g),
                  pooled_projections=_randn(1, c.in_text_dim2, g=g), timestep=torch.full((1,), 500.0),
                  audio_hidden_states=_randn(1, audio, c.in_audio_dim, g=g),
                  encoder_attention_mask=_mask(text, valid).bool(), return_dict=False)
    return _place(model, kwargs, dtype, device)


def _wan_animate(size, dtype, device):
    from diffusers import WanAnimateTransformer3DModel

    # Wan's blocks (image tokens concatenated before the text: no added K/V), pose latents added to the patch
    # embedding of all but the reference frame, and face adapters (a cross-attention to the face motion tokens,
    # one a frame) after every inject_face_latents_blocks-th block; the face motion from a StyleGAN-like motion
    # encoder over the face crops and a causal-conv face encoder: its frames (stride 4, + 1) match the latent frames
    if size == "tiny":  # diffusers' test config (its small motion encoder), 1 Wan block + its face adapter;
        # 5 face frames -> 3 -> 2 (+ 1 padding frame) = 3 latent frames (2 pose + the reference)
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=12,
                   latent_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1,
                   image_dim=16, rope_max_seq_len=32, motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
                   motion_encoder_size=16, motion_style_dim=8, motion_dim=4, motion_encoder_dim=16,
                   face_encoder_hidden_dim=16, face_encoder_num_heads=2, inject_face_latents_blocks=1)
        pose, h, w, text, (clip, clip_dim), faces = 2, 4, 4, 6, (4, 16), 5
    else:  # Wan2.2-Animate-14B (the class defaults), the pipeline's 1280x720 segment of 77 frames: 20 pose + 1
        # reference latent frames of 90 x 160, 512 umT5 tokens, 257 CLIP tokens, 77 face crops of 512x512
        cfg = dict()
        if size == "blocks2":  # one Wan block + its face adapter (_two_blocks: 2 blocks and 2 adapters)
            cfg.update(num_layers=1, inject_face_latents_blocks=1)
        pose, h, w, text, (clip, clip_dim), faces = 20, 90, 160, 512, (257, 1280), 77
    model = _model(WanAnimateTransformer3DModel, cfg, "full" if size == "blocks2" else size)
    c = model.config
    g = _gen(device)
    kwargs = dict(hidden_states=_randn(1, c.in_channels, pose + 1, h, w, g=g), timestep=torch.full((1,), 500.0),
                  encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
                  encoder_hidden_states_image=_randn(1, clip, clip_dim, g=g),
                  pose_hidden_states=_randn(1, c.latent_channels, pose, h, w, g=g),
                  face_pixel_values=_randn(1, 3, faces, c.motion_encoder_size, c.motion_encoder_size, g=g),
                  return_dict=False)
    return _place(model, kwargs, dtype, device)


def _anyflow(size, dtype, device):
    from diffusers.models.transformers.transformer_anyflow import AnyFlowTransformer3DModel

    if size == "tiny":  # Wan's tiny widths (parts.wan_like)
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                   text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32)
        frames, height, width, text = 2, 4, 4, 6
    else:  # nvidia/AnyFlow-Wan2.1-T2V-14B-Diffusers (the class defaults: Wan 2.1 14B, 40 blocks, 5120 wide) at
        # 480x832 x 33 frames (the pipeline's example): 9 x 60 x 104 latent, 512 text tokens
        cfg, (frames, height, width, text) = dict(), (9, 60, 104, 512)
    model = _model(AnyFlowTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(1, frames, c.in_channels, height, width, g=g),  # (B, F, C, H, W): frames first
        timestep=torch.full((1, frames), 500.0),  # per frame, as the pipeline repeats t
        r_timestep=torch.full((1, frames), 250.0),  # the flow map's target timestep
        encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _anyflow_far(size, dtype, device):
    from diffusers import AnyFlowFARTransformer3DModel

    # AnyFlow's Wan blocks made frame-autoregressive: chunks of latent frames attend causally chunk by chunk (flex
    # attention over a block mask built in the forward); the chunks past full_chunk_limit back patched 4x coarser.
    # The rollout call: every chunk in one forward, as diffusers' test runs it (the pipeline's KV-cached steps: not
    # built)
    if size == "tiny":  # diffusers' test config at head dim 16, 1 layer; two chunks of two frames
        cfg = dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3, num_attention_heads=2,
                   attention_head_dim=16, in_channels=4, out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32,
                   num_layers=1, rope_max_seq_len=32)
        chunks, height, width, text = [2, 2], 16, 16, 12
    else:  # the class defaults (Wan 2.1 14B's widths, 40 blocks) and chunk partition (21 latent frames: 480x832 x 81
        # frames, 60 x 104 latent), 512 text tokens
        cfg = dict()
        chunks, height, width, text = [1, 3, 3, 3, 3, 3, 3, 2], 60, 104, 512
        if size == "blocks2":  # a quarter of the tokens, the same chunks: eager's flex attention materializes its
            # scores (over 140 GB at 60 x 104)
            height, width = 30, 52
    model = _model(AnyFlowFARTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    frames = sum(chunks)
    kwargs = dict(hidden_states=_randn(1, frames, c.in_channels, height, width, g=g),  # frames first
                  timestep=torch.full((1, frames), 500.0), r_timestep=torch.full((1, frames), 250.0),
                  encoder_hidden_states=_randn(1, text, c.text_dim, g=g), chunk_partition=chunks, return_dict=False)
    return _place(model, kwargs, dtype, device)


def _wan_animate2(size, dtype, device):
    from diffusers import WanAnimate2Transformer3DModel
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    # Wan 2.1's blocks (+ CLIP image tokens) animating a reference: once a segment, a reference pass over the
    # driving video's latents stores every layer's keys and values ("extract"); each denoising step then attends
    # to them ("cached") - the call built here, its cache filled by one reference pass at build time. Per-sample
    # lists in and out (ListDiT); its RoPE in float64, per sample, on the valid tokens
    if size == "tiny":  # diffusers' test config at 1 layer: a 5-frame 32x32 segment, 2 reference latent frames
        cfg = dict(patch_size=(1, 2, 2), text_len=16, in_dim=36, dim=128, ffn_dim=256, freq_dim=64, text_dim=32,
                   out_dim=16, num_heads=4, num_layers=1)
        ref, h, w, text, (length, area) = 2, 4, 4, 8, (5, [32, 32])
    else:  # the class defaults (Wan 2.1 14B's widths, 40 blocks), a 77-frame 832x480 segment: 20 reference latent
        # frames of 60 x 104, 512 umT5 tokens, 257 CLIP tokens
        cfg = dict()
        ref, h, w, text, (length, area) = 20, 60, 104, 512, (77, [480, 832])
        if size == "blocks2":  # 4 reference frames of 30 x 52: eager's attention over the cached keys materializes
            # its scores (312 GB for the full segment)
            ref, h, w, (length, area) = 4, 30, 52, (13, [240, 416])
    dit = _model(WanAnimate2Transformer3DModel, cfg, size)
    c = dit.config
    g = _gen(device)
    grid, patches = torch.tensor([[ref, h // 2, w // 2]]), (h // 2) * (w // 2)
    condition = c.in_dim - c.out_dim  # the condition latents and the 4-channel i2v mask
    kwargs = dict(hidden_states=_randn(1, c.out_dim, ref + 1, h, w, g=g),  # the reference image's slot first
                  timestep=torch.full((1,), 500.0), encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
                  condition_latents=_randn(1, condition, ref + 1, h, w, g=g),
                  encoder_hidden_states_image=_randn(1, 4 if size == "tiny" else 257, 1280, g=g))
    reference = dict(hidden_states=_randn(1, c.out_dim, ref, h, w, g=g),
                     condition_latents=_randn(1, condition, ref, h, w, g=g))
    model = ListDiT(dit, lists=("hidden_states", "encoder_hidden_states", "condition_latents"))
    model, kwargs = _place(model, dict(kwargs, **{f"reference_{k}": v for k, v in reference.items()}), dtype, device)
    reference = {k: kwargs.pop(f"reference_{k}") for k in reference}
    cache = WanAnimate2KVCache(c.num_layers)
    if torch.device(device).type != "meta":  # (on the meta device: the config and inputs only)
        with torch.no_grad():
            model(**dict(kwargs, **reference, timestep=kwargs["timestep"] * 0 + 1.0), kv_cache=cache,
                  kv_cache_mode="extract", seq_len=ref * patches, offset_grid_sizes=grid)
    kwargs.update(kv_cache=cache, kv_cache_mode="cached", seq_len=(ref + 1) * patches, reference_grid_sizes=grid,
                  origin_len=length, origin_area=area)
    return model, kwargs


MODELS: Dict[str, ModelCase] = {
    "chronoedit": ModelCase("chronoedit", _chronoedit, "ChronoEditTransformer3DModel (tiny: 1 layer, I2V image "
                            "tokens, two latent frames)"),
    "cosmos": ModelCase("cosmos", _cosmos, "CosmosTransformer3DModel, Cosmos-Predict2.5 (tiny: 1 layer, the padding "
                        "mask as a condition channel)"),
    "ltx2": ModelCase("ltx2", _ltx2, "LTX2VideoTransformer3DModel, LTX-2 (tiny: 1 audio-video layer)"),
    "motif_video": ModelCase("motif_video", _motif_video, "MotifVideoTransformer3DModel (tiny: 1 dual + 1 single "
                             "block)"),
    "minimax_h3": ModelCase("minimax_h3", _minimax_h3, "MiniMaxH3Transformer3DModel (tiny: 1 layer, 1 refiner "
                            "layer, packed text / audio / video rows)"),
    "kandinsky5": ModelCase("kandinsky5", _kandinsky5, "Kandinsky5Transformer3DModel, T2V Lite (tiny: 1 text + 1 "
                            "visual block)"),
    "kandinsky6": ModelCase("kandinsky6", _kandinsky6, "Kandinsky6Transformer3DModel, Lite TI2VA (tiny: 1 text block "
                            "a branch + 1 fused video/audio block)"),
    "wan_animate": ModelCase("wan_animate", _wan_animate, "WanAnimateTransformer3DModel (tiny: 1 Wan block + 1 face "
                             "adapter)"),
    "anyflow": ModelCase("anyflow", _anyflow, "AnyFlowTransformer3DModel, Wan 2.1 with a dual-timestep embedder "
                                           "(tiny: 1 block)"),
    # the reference pass and the RoPE's grid_sizes.tolist() need real tensors: no meta-device run
    "wan_animate2": ModelCase("wan_animate2", _wan_animate2, "WanAnimate2Transformer3DModel, Wan-Animate 2, a cached "
                              "denoising step (tiny: 1 block)", meta=False,
                              fewer_tokens="eager's attention over the cached keys materializes its scores: 312 GB "
                                           "for the full segment"),
    # its attention only through flex attention, which refuses the meta device
    "anyflow_far": ModelCase("anyflow_far", _anyflow_far, "AnyFlowFARTransformer3DModel, frame-autoregressive AnyFlow "
                             "(tiny: 1 block, two chunks)", meta=False,
                             fewer_tokens="eager's flex attention materializes its scores: over 140 GB at 60 x 104"),
}
