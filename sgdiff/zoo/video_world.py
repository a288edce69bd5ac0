"""Camera-controlled world models: SANA-WM's stage-1 DiT and its LTX-2 stage-2 refiner (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from sgdiff.zoo.parts import ModelCase, _gen, _model, _place, _randn
from sgdiff.zoo.video_more import _mask


def _camera(frames: int, h: int, w: int, action: str):
    """SanaWMPipeline's camera inputs for a ``frames`` x ``h`` x ``w`` latent (LTX-2 VAE: 8x temporal, 32x spatial):
    the c2w trajectory of an action string (the pipeline's example DSL), a centred pinhole camera of focal length
    0.625 x the width in pixels, packed by its prepare_camera: ``raymap`` (T, 20), the first pose's inverse times
    each latent frame's pose (4x4, flat) and [fx, fy, cx, cy] on the latent grid; ``chunk_plucker`` (48, T, h, w),
    the Pluecker rays (direction, moment) of the 8 pixel frames each latent frame covers."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w, prepare_camera

    c2w = action_string_to_c2w(action)[: (frames - 1) * 8 + 1]
    height, width = h * 32, w * 32
    intrinsics = np.tile(np.array([0.625 * width, 0.625 * width, width / 2, height / 2], np.float32), (len(c2w), 1))
    cam = prepare_camera(c2w, intrinsics, target_size=(height, width), vae_stride=(8, 32, 32))
    return cam["raymap"][None], cam["chunk_plucker"][None]


def _trained_convs(model):
    """SANA-WM's temporal short convolutions on K (conv_k, conv_k_cam) and its Pluecker embedder start at zero (the
    GDN keys would be zero, the GDN branches and the Pluecker injection would add nothing); random ones, as the
    released checkpoint has, so that their chains reach the output."""
    from diffusers.models.transformers.transformer_sana_wm import SanaWMTemporalShortConvolution

    for name, m in model.named_modules():
        if isinstance(m, SanaWMTemporalShortConvolution):
            torch.nn.init.normal_(m.weight, std=m.kernel_size ** -0.5)
        elif name == "plucker_embedder":
            m.proj.reset_parameters()
    return model


def _sana_wm(size, dtype, device):
    from diffusers import SanaWMTransformer3DModel
    from diffusers.models.transformers.transformer_sana_wm import _process_camera_conditions_ucpe

    # adaLN blocks with per-frame modulation rows (timestep (B, 1, T)): a camera-conditioned attention, the text
    # cross-attention, GLUMBConvTemp (1x1 conv + SiLU, depthwise 3x3, SiLU GLU, 1x1 conv, + a residual temporal
    # conv). The attention of every softmax_every_n-th block is softmax (SDPA on RoPE'd q, k), the others a
    # bidirectional Gated-DeltaNet (ReLU q, k after RMSNorms, a short temporal conv on k, a per-frame delta-rule scan
    # forwards and backwards in fp32, RoPE on the numerator stream); each beside a camera branch (UCPE: q, k, v
    # rotated by each ray's 4x4 world->ray transform and RoPE, the same rule or SDPA, rotated back), summed, through
    # a SiLU output gate. The Pluecker rays are embedded once and added after every block's attention
    if size == "tiny":  # the diffusers test's widths; 2 blocks with softmax_every_n 2: one GDN, one softmax block
        cfg = dict(in_channels=4, num_layers=2, hidden_size=32, num_attention_heads=2, softmax_every_n=2,
                   linear_head_dim=16, caption_channels=8, mlp_ratio=2.0)
        (frames, h, w), (text, valid), action = (3, 4, 4), (6, 4), "w-8,jw-8"
    else:  # Efficient-Large-Model/SANA-WM_bidirectional (the class defaults: 20 blocks, 2240 wide, a softmax block
        # every 4th), the pipeline's 704x1280 x 161 frames: 21 x 22 x 40 latent (LTX-2 VAE, 128 channels), 300
        # Gemma-2 tokens; the camera of its example action "w-80,jw-40,w-40"
        cfg = dict()
        if size == "blocks2":  # a GDN block, then a softmax one
            cfg.update(softmax_every_n=2)
        (frames, h, w), (text, valid), action = (21, 22, 40), (300, 120), "w-80,jw-40,w-40"
    model = _trained_convs(_model(SanaWMTransformer3DModel, cfg, size))
    c = model.config
    g = _gen(device)
    with torch.device("cpu"):  # the same inputs on every device
        camera, plucker = _camera(frames, h, w, action)
        # the camera geometry the forward derives from camera_conditions (each latent pixel's ray by the UCM
        # unprojection, its ray<-world 4x4 transform, the up / latitude map), passed as cam_pos_embeds: made here in
        # fp32 by the model's own _process_camera_conditions_ucpe, where the forward makes it in the model's dtype,
        # which its create_grid refuses on the CPU in bf16. The transforms' inverse and the blocks' UCPE run in the
        # forward
        raymats, absmap = _process_camera_conditions_ucpe(camera, 1, (frames, h, w), tuple(c.patch_size))
    t = torch.full((1, 1, frames), 500.0)
    t[..., 0] = 0.0  # the first latent frame is the image's: its timestep pinned to 0
    kwargs = dict(hidden_states=_randn(1, c.in_channels, frames, h, w, g=g),
                  encoder_hidden_states=_randn(1, 1, text, c.caption_channels, g=g),  # (B, 1, L, D), as encoded
                  mask=_mask(text, valid), camera_conditions=camera, chunk_plucker=plucker,
                  cam_pos_embeds=dict(absmap=absmap.permute(0, 4, 1, 2, 3), P=raymats.flatten(1, 3)),
                  return_dict=False)
    model, kwargs = _place(model, kwargs, dtype, device)
    kwargs["cam_pos_embeds"] = {k: v.to(device=device, dtype=dtype) for k, v in kwargs["cam_pos_embeds"].items()}
    kwargs["timestep"] = t.to(device)  # fp32, as the pipeline's torch.min(t, (1 - mask) * 1000) leaves it
    return model, kwargs


def _sana_wm_refiner(size, dtype, device):
    from diffusers import SanaWMLTX2RefinerTransformer3DModel
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache

    # LTX-2's video stream alone: adaLN-single per-token modulation, self-attention (RMSNorm q / k across heads,
    # interleaved RoPE) over [attention sink + refined history + active block] keys and values held by a
    # sliding-window KV cache, the text cross-attention (not modulated), a GELU-tanh FF. The call built is a
    # denoising step of SanaWMLTX2Refiner ("inject": the cache read, not written), its cache filled at build time as
    # the refiner fills it: the sink frames' pre-RoPE keys and values from a capture_pre_rope pass at sigma 0, the
    # history's post-RoPE ones from one inject_and_capture_post_rope pass over the history frames at sigma 0 (the
    # refiner captures them block by block: the same shapes), and the sink's RoPE at its sliding offset
    if size == "tiny":  # the diffusers test's widths, 1 layer; 4 x 4 latent frames: sink 0, history 1-2, active 3-4
        cfg = dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
                   attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
                   audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1,
                   caption_channels=16, rope_double_precision=False)
        (h, w), text, (sink, history, start, active) = (4, 4), 6, (1, 2, 3, 2)
    else:  # SANA-WM_bidirectional-diffusers-refiner (LTX-2 19B: the class defaults, 48 layers), refining the 21 x
        # 22 x 40 stage-1 latent at 16 fps (the pipeline's block_size 3, kv_max_frames 11, sink_size 1): the
        # steady window: sink frame 0, history 3-12 (blocks 1-3, ..., 10-12, trimmed to 10), active block 13-15;
        # 1024 connector tokens
        cfg = dict()
        (h, w), text, (sink, history, start, active) = (22, 40), 1024, (1, 10, 13, 3)
    model = _model(SanaWMLTX2RefinerTransformer3DModel, cfg, size)
    c = model.config
    g = _gen(device)
    per_frame = h * w
    latent = dict(hidden_states=_randn(1, active * per_frame, c.in_channels, g=g),
                  sink_states=_randn(1, sink * per_frame, c.in_channels, g=g),
                  history_states=_randn(1, history * per_frame, c.in_channels, g=g),
                  encoder_hidden_states=_randn(1, text, c.caption_channels, g=g))
    model, latent = _place(model, latent, dtype, device)
    text_kwargs = dict(encoder_hidden_states=latent.pop("encoder_hidden_states"),
                       encoder_attention_mask=torch.ones(1, text, dtype=torch.long, device=device))  # registers: ones

    def rope(first, n):  # the caller's (cos, sin) for absolute latent frames [first, first + n), fp32
        return model.build_rotary_emb_for_absolute_positions(1, list(range(first, first + n)), h, w, device, 16.0)

    def step(states, first, sigma):  # the refiner's per-token timestep, sigma x timestep_scale_multiplier, fp32
        return dict(text_kwargs, hidden_states=states, video_rotary_emb=rope(first, states.shape[1] // per_frame),
                    timestep=torch.full(states.shape[:2], sigma * c.timestep_scale_multiplier, device=device),
                    return_dict=False)

    cache = SanaWMRefinerKVCache(c.num_layers)
    with torch.no_grad():
        model(**step(latent["sink_states"], 0, 0.0), kv_cache=cache, kv_cache_mode="capture_pre_rope")
        for layer in cache.layer_caches:
            layer.store_sink(*layer.get_captured_pre_rope())
        cache.sink_pe = rope(start - history - sink, sink)  # the sink slid to sit just before the history
        model(**step(latent["history_states"], start - history, 0.0), kv_cache=cache,
              kv_cache_mode="inject_and_capture_post_rope")
        for layer in cache.layer_caches:
            layer.store_history(*layer.get_captured_post_rope())
    kwargs = dict(step(latent["hidden_states"], start, 0.909375), kv_cache=cache, kv_cache_mode="inject")
    return model, kwargs  # (sigma 0.909375: the first of the distilled schedule's three steps)


MODELS: Dict[str, ModelCase] = {
    "sana_wm": ModelCase("sana_wm", _sana_wm, "SanaWMTransformer3DModel, SANA-WM's camera-controlled stage-1 DiT "
                         "(tiny: 1 GDN + 1 softmax block)"),
    "sana_wm_refiner": ModelCase("sana_wm_refiner", _sana_wm_refiner, "SanaWMLTX2RefinerTransformer3DModel, SANA-WM's "
                                 "LTX-2 stage-2 refiner: the denoising step of one AR block (kv_cache_mode 'inject'), "
                                 "its sink and history keys and values in a KV cache filled at build time (tiny: 1 "
                                 "layer)"),
}
