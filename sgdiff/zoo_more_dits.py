"""More DiTs of ``diffusers.models.transformers`` for the zoo (:mod:`sgdiff.zoo` registers them):
the same contract, ``build(size, dtype, device) -> (model, kwargs)``, tiny configs from the
shapes diffusers' own tests use, ``full`` the published architecture with random weights.
:data:`NOT_YET` names the DiTs tried and left out, with the reason."""
from __future__ import annotations

import torch

from sgdiff.zoo_parts import ModelCase, _gen, _image_ids, _model, _place, _randn, wan_like


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


MODELS = {
    "auraflow": ModelCase("auraflow", _auraflow, "AuraFlowTransformer2DModel (tiny: 1 MMDiT + 1 single block)"),
    "hunyuandit": ModelCase("hunyuandit", _hunyuandit, "HunyuanDiT2DModel (tiny: 4 layers, the last with a long skip)"),
    "latte": ModelCase("latte", _latte, "LatteTransformer3DModel (tiny: 1 spatial + 1 temporal block)"),
    "skyreels_v2": ModelCase("skyreels_v2", _skyreels_v2, "SkyReelsV2Transformer3DModel (tiny: 1 layer; Wan's blocks, "
                             "text-to-video)"),
    "allegro": ModelCase("allegro", _allegro, "AllegroTransformer3DModel (tiny: 1 layer, the pipeline's RoPE tables)"),
    "sanavideo": ModelCase("sanavideo", _sanavideo, "SanaVideoTransformer3DModel (tiny: 1 layer)"),
    "wan_vace": ModelCase("wan_vace", _wan_vace, "WanVACETransformer3DModel (tiny: 1 Wan block + 1 VACE block)"),
    "easyanimate": ModelCase("easyanimate", _easyanimate, "EasyAnimateTransformer3DModel, V5.1 (tiny: 1 MMDiT + 1 "
                             "image-only block)"),
    "cogview3plus": ModelCase("cogview3plus", _cogview3plus, "CogView3PlusTransformer2DModel (tiny: 1 layer)"),
    "ovis_image": ModelCase("ovis_image", _ovis_image, "OvisImageTransformer2DModel (tiny: 1 double + 1 single block)"),
    "longcat_image": ModelCase("longcat_image", _longcat_image, "LongCatImageTransformer2DModel (tiny: 1 double + 1 "
                               "single block, the pipeline's position ids)"),
    "dit": ModelCase("dit", _dit, "DiTTransformer2DModel, DiT-XL/2 (tiny: 1 layer, class-conditional)"),
}

#: DiTs tried and not in the zoo yet, and why
NOT_YET = {
    "MochiTransformer3DModel": "its attention processor calls torch.nonzero, a graph break under torch.compile's "
                               "defaults: the attention runs eagerly and each QK norm and RoPE compiles as a small "
                               "graph of its own, so its sites cannot be counted per block; its full config does not "
                               "run on the meta device (autocast has no 'meta' device type)",
    "ConsisIDTransformer3DModel": "its face injection `hidden + local_face_scale * cross_attention(...)` scales "
                                  "by a Python float, which the residual family skips ('update is not a tensor'); "
                                  "equal in fp32 and bf16 on the CPU, not registered until that spelling is a site",
    "OmniGenTransformer2DModel": "its RoPE module compares the largest position id with a limit in Python "
                                 "(`if seq_len > original_max_position_embeddings`): a graph break, and its full "
                                 "config cannot run on the meta device (.item() of a meta tensor)",
    "ZImageTransformer2DModel": "its forward takes lists (x, t, cap_feats) and returns a list, where the zoo's "
                                "contract (tests, benches, trajectories) is a tensor in and out; built and equal "
                                "in fp32 and bf16 on the CPU with Lumina2's counts, not yet registered",
}
