"""Image DiTs whose forward breaks the graph, caches keys or routes tokens to experts: GLM-Image, HunyuanImage 2.1,
OmniGen, HiDream-I1, Qwen-Image 2.1, Nucleus-Image (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ModelCase, _gen, _model, _place, _randn


def _glm_image(size, dtype, device):
    from diffusers import GlmImageTransformer2DModel
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    # CogView4-like joint blocks over [glyph text, image]: one AdaLayerNormZero table per block modulates both
    # streams (12 rows), RoPE on the image rows of q and k only, a per-head LayerNorm on q and k; the image tokens
    # add the projected embeddings of the autoregressive model's prior tokens (zeroed where prior_token_drop)
    if size == "tiny":  # the diffusers test's widths
        cfg = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
                   num_attention_heads=2, text_embed_dim=32, time_embed_dim=16, condition_dim=8,
                   prior_vq_quantizer_codebook_size=64)
        latent, text = 8, 12
    else:  # zai-org/GLM-Image transformer/config.json (30 layers, 32 heads of 128: 4096 wide, ByT5 glyph text 1472)
        # at 1024x1024: 128x128 latent, patch 2 -> 4096 image tokens (and 4096 prior tokens: the AR model's 32-pixel
        # tokens upsampled 2x); 16 ByT5 glyph tokens (the quoted text of a prompt, its bytes)
        cfg = dict(patch_size=2, in_channels=16, out_channels=16, num_layers=30, attention_head_dim=128,
                   num_attention_heads=32, text_embed_dim=1472, time_embed_dim=512, condition_dim=256,
                   prior_vq_quantizer_codebook_size=16384)
        latent, text = 128, 16
    model = _model(GlmImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    tokens = (latent // c.patch_size) ** 2
    kwargs = dict(
        hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
        encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
        prior_token_id=torch.randint(0, c.prior_vq_quantizer_codebook_size, (1, tokens), generator=g, device="cpu"),
        prior_token_drop=torch.zeros(1, tokens, dtype=torch.bool),  # the conditional pass (the unconditional: True)
        timestep=torch.full((1,), 499.0),  # the pipeline's t - 1
        target_size=torch.tensor([[latent * 8.0, latent * 8.0]]),  # (height, width) in pixels
        crop_coords=torch.zeros(1, 2),
        return_dict=False,
    )
    model, kwargs = _place(model, kwargs, dtype, device)
    # text-to-image: the pipeline passes an empty KV cache (mode None: nothing stored or read)
    kwargs["kv_caches"] = GlmImageKVCache(num_layers=c.num_layers)
    return model, kwargs


def _hunyuan_image(size, dtype, device):
    from diffusers import HunyuanImageTransformer2DModel

    # HunyuanVideo's blocks on an image: a token refiner on the Qwen text, dual-stream blocks (AdaLayerNormZero on
    # image and text, RMSNorm on q and k, RoPE on the image rows), then single-stream blocks; the ByT5 glyph tokens
    # (context_embedder_2) are reordered with the text by their masks (valid glyph, valid text, padded glyph,
    # padded text) before the blocks
    if size == "tiny":  # the diffusers pipeline test's transformer (no model test): heads 4 x 8, RoPE axes (4, 4)
        cfg = dict(in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=1,
                   num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), guidance_embeds=False,
                   text_embed_dim=32, text_embed_2_dim=32, rope_axes_dim=(4, 4))
        latent, text, valid, glyph = 8, 12, 9, 6
    else:  # HunyuanImage-2.1 (diffusers' scripts/convert_hunyuan_image_to_diffusers.py, hunyuanimage2.1: 20 dual +
        # 40 single blocks, 28 heads of 128, Qwen2.5-VL text 3584, ByT5 glyph text 1472) at the pipeline's 2048x2048:
        # 64x64 latent (32x VAE, 64 channels), patch 1 -> 4096 tokens; 1000 Qwen tokens (padded to
        # tokenizer_max_length, 80 of them valid), 128 ByT5 tokens
        cfg = dict(in_channels=64, out_channels=64, num_attention_heads=28, attention_head_dim=128, num_layers=20,
                   num_single_layers=40, num_refiner_layers=2, patch_size=(1, 1), qk_norm="rms_norm",
                   guidance_embeds=False, text_embed_dim=3584, text_embed_2_dim=1472, rope_theta=256.0,
                   rope_axes_dim=(64, 64))
        latent, text, valid, glyph = 64, 1000, 80, 128
    model = _model(HunyuanImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    mask = (torch.arange(text) < valid).long()[None]  # the tokenizer's padded mask
    kwargs = dict(
        hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
        timestep=torch.full((1,), 500.0),  # the FlowMatch scheduler's sigma * 1000
        encoder_hidden_states=_randn(1, text, c.text_embed_dim, g=g),
        encoder_attention_mask=mask,
        # a prompt without quoted (glyph) text: the pipeline passes zeros and an all-zero mask
        encoder_hidden_states_2=torch.zeros(1, glyph, c.text_embed_2_dim),
        encoder_attention_mask_2=torch.zeros(1, glyph, dtype=torch.long),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


# OmniGen-v1's su-scaled RoPE factors (Phi-3's, 48 per table: head dim 96 / 2), as diffusers'
# scripts/convert_omnigen_to_diffusers.py passes them
_OMNIGEN_LONG = [1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547, 1.2299998998641968,
                 1.2299998998641968, 1.2999999523162842, 1.4499999284744263, 1.5999999046325684, 1.6499998569488525,
                 1.8999998569488525, 2.859999895095825, 3.68999981880188, 5.419999599456787, 5.489999771118164,
                 5.489999771118164, 9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
                 15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055, 30.009998321533203,
                 32.35000228881836, 32.590003967285156, 35.56000518798828, 39.95000457763672, 53.840003967285156,
                 56.20000457763672, 57.95000457763672, 59.29000473022461, 59.77000427246094, 59.920005798339844,
                 61.190006256103516, 61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
                 63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922, 64.760009765625,
                 64.80001068115234, 64.81001281738281, 64.81001281738281]
_OMNIGEN_SHORT = [1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002, 1.2500000000000002, 1.4000000000000004,
                  1.4500000000000004, 1.5500000000000005, 1.8500000000000008, 1.9000000000000008] + \
                 [2.000000000000001] * 19 + \
                 [2.1000000000000005, 2.1000000000000005, 2.2, 2.3499999999999996, 2.3499999999999996,
                  2.3499999999999996, 2.3499999999999996, 2.3999999999999995, 2.3999999999999995, 2.6499999999999986,
                  2.6999999999999984, 2.8999999999999977, 2.9499999999999975, 3.049999999999997, 3.049999999999997,
                  3.049999999999997]


def _omnigen(size, dtype, device):
    from diffusers import OmniGenTransformer2DModel
    from diffusers.pipelines.omnigen.processor_omnigen import OmniGenCollator

    # a Phi-3 decoder over [instruction tokens, a time token, image tokens]: RMSNorm, attention with the su-scaled
    # RoPE (cos/sin tables computed per call from the position ids), a SwiGLU MLP; AdaLayerNorm on the image rows
    # at the end. Text-to-image: no input images (no image latents spliced into the instruction tokens)
    if size == "tiny":  # the diffusers test's widths
        cfg = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=1,
                   pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
                   rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]})
        latent, prompt, negative = 8, 10, 14
    else:  # OmniGen-v1 (the class defaults: Phi-3-mini's 32 layers, 3072 wide, 32 heads; the su RoPE factors of
        # diffusers' conversion script) at the pipeline's 1024x1024: 128x128 latent, patch 2 -> 4096 image tokens;
        # instructions of 48 and 128 tokens (the prompt in the pipeline's template, the default negative prompt)
        cfg = dict(rope_scaling={"long_factor": _OMNIGEN_LONG, "short_factor": _OMNIGEN_SHORT})
        latent, prompt, negative = 128, 48, 128
    model = _model(OmniGenTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the pipeline's collator: left-padded instructions, a causal mask over the instruction and the time token,
    # full attention among the image tokens, position ids counting from the first unpadded token
    ids = [torch.randint(3, c.vocab_size, (n,), generator=g, device="cpu").tolist() for n in (prompt, negative)]
    inputs = [{"input_ids": x, "pixel_values": None, "image_sizes": None} for x in ids]
    pixels = latent * 8
    with torch.device("cpu"):  # made on the CPU (the collator reads them back), then placed
        input_ids, position_ids, mask, _, _, sizes = OmniGenCollator(hidden_size=c.hidden_size).process_mllm_input(
            inputs, [[pixels, pixels]] * 2)
    kwargs = dict(
        hidden_states=_randn(2, c.in_channels, latent, latent, g=g),  # classifier-free guidance: cond, negative
        timestep=torch.full((2,), 0.5),  # the scheduler's t in [0, 1] (num_train_timesteps=1)
        input_ids=input_ids,
        input_img_latents=[],
        input_image_sizes=sizes,
        position_ids=position_ids,
        return_dict=False,
    )
    model, kwargs = _place(model, kwargs, dtype, device)
    kwargs["attention_mask"] = mask.to(device)  # fp32, as the pipeline passes it
    return model, kwargs


def _hidream(size, dtype, device):
    from diffusers import HiDreamImageTransformer2DModel

    # dual-stream blocks (image and text modulated by one 12-row adaLN table, QK RMSNorm across heads, RoPE as 2x2
    # rotation matrices on q and k, a routed MoE SwiGLU plus a shared expert on the image stream, a SwiGLU on the
    # text), then single-stream blocks over [image, text]; each block appends the projected states of one Llama-3
    # layer to the T5 + Llama text it attends to
    if size == "tiny":  # the diffusers test's widths
        cfg = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
                   num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2,
                   num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(32, 32), llama_layers=(0, 1),
                   force_inference_output=True)
        latent, text = 32, 8
    else:  # HiDream-I1 (HiDream-I1-Dev's transformer/config.json; Dev and Fast are distillations of I1-Full, one
        # architecture: 16 dual + 32 single blocks, 20 heads of 128, 4 routed experts (2 active), T5 and Llama-3.1-8B
        # text 4096, CLIP pooled 2048; the last 17 blocks all take Llama layer 31) at the pipeline's 1024x1024: 128x128
        # latent, patch 2 -> 4096 tokens (max_resolution's: square, no padding mask); 128 T5 and 128 Llama tokens
        # (max_sequence_length)
        cfg = dict(patch_size=2, in_channels=16, out_channels=16, num_layers=16, num_single_layers=32,
                   attention_head_dim=128, num_attention_heads=20, caption_channels=[4096, 4096], text_emb_dim=2048,
                   num_routed_experts=4, num_activated_experts=2, axes_dims_rope=(64, 32, 32),
                   max_resolution=(128, 128), llama_layers=list(range(32)) + [31] * 16)
        latent, text = 128, 128
        if size == "blocks2":  # one Llama layer per block: the first dual block's and the first single block's
            cfg["llama_layers"] = [0, 16]
    model = _model(HiDreamImageTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    batch = 2  # classifier-free guidance (guidance_scale 5.0): negative and positive prompts in one batch
    # the pipeline stacks every Llama hidden state (32 layers): [layers, batch, tokens, 4096]
    llama = max(c.llama_layers) + 1 if size == "tiny" else 32
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        timesteps=torch.full((batch,), 500.0),
        encoder_hidden_states_t5=_randn(batch, text, c.caption_channels[0], g=g),
        encoder_hidden_states_llama3=_randn(llama, batch, text, c.caption_channels[1], g=g),
        pooled_embeds=_randn(batch, c.text_emb_dim, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _qwenimage21(size, dtype, device, use_kv_cache=True):
    from diffusers import QwenImage21Transformer2DModel
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    # single-stream blocks over [text, target image] with one modulation shared by every block (scale and tanh-gate
    # rows; text tokens take the t = 0 row: causal_condition), affine-free LayerNorms, per-head RMSNorm on q and k,
    # complex RoPE, SwiGLU; block-causal attention (causal text, bidirectional image). The pipeline's default KV
    # cache: the first step prefills the text keys and values ("extract"), every later step runs the target image
    # only against them ("cached") - the call built here, its cache filled by one prefill at build time
    if size == "tiny":  # the diffusers test's widths (head dim 16 = RoPE axes 4 + 6 + 6)
        cfg = dict(patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=16,
                   num_attention_heads=2, context_in_dim=8, mlp_ratio=2, axes_dims_rope=(4, 6, 6))
        (height, width), text = (4, 4), 4
    else:  # Qwen-Image 2.1 (the class defaults: 32 blocks, 32 heads of 128, Qwen3-VL text 4096, 64 latent channels
        # unpatched) at the pipeline's 1024x1024: 64x64 latent (16x VAE) -> 4096 image tokens; 64 prompt tokens (the
        # t2i template's user turn, unpadded: no mask); no guidance (true_cfg_scale 1.0)
        cfg, (height, width), text = dict(), (64, 64), 64
    model = _model(QwenImage21Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    tokens = height * width
    # the vision-language sequence: text slots, then one slot per 2x2 group of target latents
    img_mask = torch.cat([torch.zeros(1, text, dtype=torch.bool), torch.ones(1, tokens // 4, dtype=torch.bool)], 1)
    kwargs = dict(
        hidden_states=_randn(1, tokens, c.in_channels, g=g),
        encoder_hidden_states=_randn(1, text, c.context_in_dim, g=g),
        timestep=torch.full((1,), 0.5),  # the pipeline's t / 1000
        img_shapes=[[(1, height, width)]],
        img_mask=img_mask,
        return_dict=False,
    )
    model, kwargs = _place(model, kwargs, dtype, device)
    if use_kv_cache and torch.device(device).type != "meta":  # (on the meta device: the config and inputs only)
        cache = QwenImage21KVCache(c.num_layers)
        with torch.no_grad():  # the first step's prefill, at its own timestep
            model(**dict(kwargs, timestep=kwargs["timestep"] * 0 + 1.0), kv_cache=cache, kv_cache_mode="extract")
        kwargs.update(kv_cache=cache, kv_cache_mode="cached")
    return model, kwargs


def _experts(model):
    """NucleusMoE's packed expert weights are torch.empty (whatever memory held: NaNs, or zeros that silence the
    routed experts): random, as a checkpoint's."""
    for name, p in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            torch.nn.init.normal_(p.data, std=0.02)
    return model


def _nucleus_moe(size, dtype, device):
    from diffusers import NucleusMoEImageTransformer2DModel

    # single-stream image blocks that cross-attend to the text (image queries over [image, projected text] keys, GQA,
    # RMSNorm on q and k, complex RoPE on image and text keys), image stream modulated by scale and tanh-gate rows; the
    # first blocks dense SwiGLU, the rest expert-choice MoE (each expert takes its top-C tokens: no data-dependent
    # shapes) plus a shared SwiGLU expert, the routed experts in two grouped GEMMs (use_grouped_mm, as published)
    if size == "tiny":  # the diffusers test's widths; one dense and one MoE block (the test's are all dense), GQA as
        # the checkpoint's 16 / 4 heads, 4 toy experts with capacity factor 2 (8 of the 16 tokens each)
        cfg = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                   num_attention_heads=4, num_key_value_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4),
                   moe_enabled=True, dense_moe_strategy="leave_first_block_dense", num_experts=4,
                   moe_intermediate_dim=32, capacity_factors=[0.0, 2.0], use_grouped_mm=True)
        (height, width), text = (4, 4), 8
    else:  # Nucleus-Image transformer/config.json (32 blocks, the first 3 dense; 16 heads of 128, 4 KV heads; 64
        # experts of 1344, capacity 4.0 in blocks 3-4 and 2.0 after; Qwen3-VL text 4096) at the pipeline's 1024x1024:
        # 128x128 latent (8x VAE), patch 2 -> 4096 tokens; 64 prompt tokens (padded to a multiple of 8, all valid: no
        # mask); guidance 4.0 runs the negative prompt as a second call of the same shapes
        cfg = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=32, attention_head_dim=128,
                   num_attention_heads=16, num_key_value_heads=4, joint_attention_dim=4096, axes_dims_rope=(16, 56, 56),
                   mlp_ratio=4.0, moe_enabled=True, dense_moe_strategy="leave_first_three_blocks_dense",
                   num_experts=64, moe_intermediate_dim=1344, capacity_factors=[0.0] * 3 + [4.0] * 2 + [2.0] * 27,
                   use_sigmoid=False, route_scale=2.5, use_grouped_mm=True)
        if size == "blocks2":  # one dense block and the first MoE block (block 3's capacity factor)
            cfg.update(dense_moe_strategy="leave_first_block_dense", capacity_factors=[0.0, 4.0])
        (height, width), text = (64, 64), 64
    model = _experts(_model(NucleusMoEImageTransformer2DModel, cfg, size))
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(1, height * width, c.in_channels, g=g),
        timestep=torch.full((1,), 0.5),  # the pipeline's t / num_train_timesteps
        encoder_hidden_states=_randn(1, text, c.joint_attention_dim, g=g),
        img_shapes=[(1, height, width)],
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


#: all but Nucleus-Image do not run on the meta device (nonzero, bincount and repeat_interleave have no meta
#: kernel there; .item() of a meta tensor)
MODELS: Dict[str, ModelCase] = {
    "glm_image": ModelCase("glm_image", _glm_image, "GlmImageTransformer2DModel, GLM-Image (tiny: 1 block)",
                           meta=False),
    "hunyuan_image": ModelCase("hunyuan_image", _hunyuan_image, "HunyuanImageTransformer2DModel, HunyuanImage 2.1 "
                               "(tiny: 1 dual + 1 single block, 1 refiner block; ByT5 glyph stream)", meta=False),
    "omnigen": ModelCase("omnigen", _omnigen, "OmniGenTransformer2DModel, OmniGen-v1 (tiny: 1 layer)", meta=False),
    "hidream": ModelCase("hidream", _hidream, "HiDreamImageTransformer2DModel, HiDream-I1 (tiny: 1 dual + 1 single "
                         "block)", meta=False),
    "qwenimage21": ModelCase("qwenimage21", _qwenimage21, "QwenImage21Transformer2DModel, Qwen-Image 2.1, cached "
                             "decode step (tiny: 1 block)", meta=False),
    "nucleus_moe": ModelCase("nucleus_moe", _nucleus_moe, "NucleusMoEImageTransformer2DModel, Nucleus-Image (tiny: 1 "
                             "dense + 1 MoE block)"),
}
