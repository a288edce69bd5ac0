"""More image DiTs: Flux3, Bria 3.2, Bria FIBO and FIBO 2, Krea 2, PRX, Z-Image, Lumina-Next (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ListDiT, ModelCase, _gen, _image_ids, _model, _place, _randn


def _flux3(size, dtype, device):
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel

    # per-mode blocks (image, reference image, text: num_layers each) and joint single blocks; text-to-image, so the
    # reference-image mode blocks are built but not run (as the pipeline calls it without image_cond_hidden_states)
    if size == "tiny":
        cfg = dict(in_channels=16, cond_in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, timestep_channels=32, axes_dims_rope=(4, 4, 4, 4))
        batch, h, w, text = 1, 4, 4, 8
    else:  # FLUX.3 (the class defaults: 5 per-mode + 28 single blocks, 3072 wide, stacked Qwen3-VL text 20480) at
        # 1024x1024: 64x64 packed latent -> 4096 image tokens, 512 text tokens
        cfg, (batch, h, w, text) = dict(), (1, 64, 64, 512)
    model = _model(Flux3Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # (t, h, w, l) position ids as Flux 2's: image (0, row, col, 0), text (0, 0, 0, i)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(),
                                         torch.zeros(1), indexing="ij"), -1)
    txt_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.zeros(1),
                                         torch.arange(text).float(), indexing="ij"), -1)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 0.5),  # in [0, 1]: the model scales it by 1000
        img_ids=img_ids.reshape(-1, 4),
        txt_ids=txt_ids.reshape(-1, 4),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _bria_inputs(c, batch: int, h: int, w: int, text: int, g) -> dict:
    """Bria's and FIBO's step inputs: packed latents, text, the scheduler's unscaled t, position ids."""
    return dict(
        hidden_states=_randn(batch, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(batch, text, c.joint_attention_dim, g=g),
        timestep=torch.full((batch,), 500.0),
        img_ids=_image_ids(h, w),
        txt_ids=torch.zeros(text, 3),
        return_dict=False,
    )


def _bria(size, dtype, device):
    from diffusers import BriaTransformer2DModel

    # Flux's blocks without pooled projections or guidance. The class defaults are Flux.1's (19 + 38 blocks, 3072
    # wide, 64 channels, axes (16, 56, 56)), not Bria's: the published BRIA-3.2 transformer/config.json is 8 + 28
    # blocks, 24 heads of 96 (2304 wide), 16 in channels, axes (0, 48, 48) (no RoPE on the first axis)
    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[0, 8, 8])
        batch, h, w, text = 1, 4, 4, 8
    else:  # BRIA-3.2 at 1024x1024: 64x64 packed latent -> 4096 tokens, 128 T5 tokens (max_sequence_length); the
        # pipeline's classifier-free guidance batches prompt and negative prompt
        cfg = dict(patch_size=1, in_channels=16, num_layers=8, num_single_layers=28, attention_head_dim=96,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=None, guidance_embeds=False,
                   axes_dims_rope=[0, 48, 48], rope_theta=10000, time_theta=10000)
        batch, h, w, text = 2, 64, 64, 128
    model = _model(BriaTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = _bria_inputs(c, batch, h, w, text, g)
    return _place(model, kwargs, dtype, device)


def _bria_fibo(size, dtype, device):
    from diffusers import BriaFiboTransformer2DModel

    # Bria's blocks; each block's text is half the running text stream, half a projection of one text-encoder layer
    if size == "tiny":
        cfg = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, text_encoder_dim=16, axes_dims_rope=[0, 8, 8])
        batch, h, w, text = 1, 4, 4, 8
    else:  # FIBO (8 B: 8 double + 38 single blocks, 3072 wide, Wan 2.2 VAE's 48 channels, SmolLM3-3B text: 2048
        # wide, its last two layers concatenated 4096) at 1024x1024: 64x64 latent tokens, 512 text tokens, CFG batch
        cfg = dict(num_layers=8, num_single_layers=38, in_channels=48, joint_attention_dim=4096, text_encoder_dim=2048)
        batch, h, w, text = 2, 64, 64, 512
    model = _model(BriaFiboTransformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    layers = [_randn(batch, text, c.text_encoder_dim, g=g) for _ in range(c.num_layers + c.num_single_layers)]
    kwargs = _bria_inputs(c, batch, h, w, text, g)
    model, kwargs = _place(model, kwargs, dtype, device)
    # one text-encoder layer per block, a list (_place moves tensors only), in the model's dtype as the pipeline's
    kwargs["text_encoder_layers"] = [t.to(device=device, dtype=dtype) for t in layers]
    return model, kwargs


def _bria_fibo2(size, dtype, device):
    from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Transformer2DModel

    # Z-Image's blocks (a noise refiner, then the main layers, some with a gated cross-attention to the text: the
    # injection layers) over [gist tokens, image tokens]; a Perceiver squeezes the text into the gist tokens
    if size == "tiny":
        cfg = dict(in_channels=4, patch_size=2, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, cap_feat_dim=16,
                   injection_layer_ids=(1,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8,
                   gist_step=4, gist_min_text_len=4, gist_max_text_len=16, axes_dims=(4, 6, 6), axes_lens=(16, 8, 8))
        latent, text = 8, 6
    else:  # FIBO 2 (the class defaults: 44 layers of which 5 inject text, 3584 wide, Qwen text 7680) at 1024x1024:
        # 128x128 latent, patch 2 -> 4096 image tokens, 512 text tokens (-> 320 gist tokens)
        cfg, (latent, text) = dict(), (128, 512)
        if size == "blocks2":  # its own block-count names: one plain and one injection layer, one refiner layer
            cfg.update(n_layers=2, injection_layer_ids=(1,), n_refiner_layers=1, perceiver_num_layers=1)
    model = _model(BriaFibo2Transformer2DModel, cfg, size)
    # its RoPE tables are built on the first call under `with torch.device("cpu")`, a graph break: build them here,
    # as the pipeline's first step leaves them
    model.rope_embedder(torch.zeros(1, 3, dtype=torch.long, device=device))
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(1, c.in_channels, latent, latent, g=g),
        timestep=torch.full((1,), 0.5),  # the noise level in [0, 1]: the pipeline's t / 1000
        # the Perceiver's bundle, then one per injection layer; no mask when nothing is padded (as the pipeline)
        encoder_hidden_states=_randn(1, 1 + len(c.injection_layer_ids), text, c.cap_feat_dim, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _krea2(size, dtype, device):
    from diffusers.models.transformers.transformer_krea2 import Krea2Transformer2DModel

    # single stream over [text, image]; the text first fuses its stack of tapped encoder layers (layerwise blocks
    # across the layer axis, then refiner blocks across tokens)
    if size == "tiny":
        cfg = dict(in_channels=16, num_layers=1, attention_head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=64, timestep_embed_dim=32, text_hidden_dim=32, num_text_layers=3,
                   text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=48,
                   num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6))
        h, w, text = 4, 4, 8
    else:  # Krea 2 (the class defaults: 28 blocks, 48 heads of 128 (6144 wide), 12 KV heads; 12 tapped layers of a
        # 2560-wide text encoder) at 1024x1024: 64x64 packed latent -> 4096 image tokens, 512 text tokens
        cfg, (h, w, text) = dict(), (64, 64, 512)
    model = _model(Krea2Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the pipeline's prepare_position_ids: text rows at the origin, image rows (0, row, col)
    position_ids = torch.cat([torch.zeros(text, 3), _image_ids(h, w)], dim=0)
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, -2:] = False  # a padded prompt: the pipeline always passes the tokenizer's mask
    kwargs = dict(
        hidden_states=_randn(1, h * w, c.in_channels, g=g),
        encoder_hidden_states=_randn(1, text, c.num_text_layers, c.text_hidden_dim, g=g),
        timestep=torch.full((1,), 0.5),  # the pipeline's t / 1000
        position_ids=position_ids,
        encoder_attention_mask=mask,
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _prx(size, dtype, device):
    from diffusers.models.transformers.transformer_prx import Modulation, PRXTransformer2DModel

    # image tokens cross-attend to [text, image] keys; one block kind
    if size == "tiny":
        cfg = dict(in_channels=4, patch_size=2, context_in_dim=16, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=1,
                   axes_dim=[8, 8])
        batch, latent, text = 2, 8, 6
    else:  # PRX (the class defaults: 16 blocks, 1792 wide, 28 heads, T5Gemma text 2304) at 1024x1024: 128x128
        # latent, patch 2 -> 4096 tokens, 256 text tokens; the pipeline's CFG batches uncond and cond
        cfg = dict()
        if size == "blocks2":  # its block count is `depth`
            cfg["depth"] = 2
        batch, latent, text = 2, 128, 256
    model = _model(PRXTransformer2DModel, cfg, size)
    for m in model.modules():  # Modulation zero-inits its linear (every block an identity): random, as trained
        if isinstance(m, Modulation):
            torch.nn.init.normal_(m.lin.weight, std=0.02)
            torch.nn.init.normal_(m.lin.bias, std=0.02)
    c = model.config
    g = _gen(device)
    mask = torch.ones(batch, text, dtype=torch.bool)
    mask[0, -2:] = False  # the pipeline's tokenizer mask (ca_mask), padded
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        timestep=torch.full((batch,), 0.5),  # the pipeline's t / num_train_timesteps
        encoder_hidden_states=_randn(batch, text, c.context_in_dim, g=g),
        attention_mask=mask,
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _lumina_next(size, dtype, device):
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina
    from diffusers.models.transformers.lumina_nextdit2d import LuminaNextDiT2DModel

    if size == "tiny":
        cfg = dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=1, num_attention_heads=4,
                   num_kv_heads=2, multiple_of=16, cross_attention_dim=16)  # GQA as the real 32 / 8 heads
        batch, latent, text = 2, 8, 6
    else:  # Lumina-Next-SFT (Alpha-VLLM/Lumina-Next-SFT-diffusers: Next-DiT 2B, 24 layers, 2304 wide, 32 heads, 8 kv
        # heads, Gemma-2B captions 2048 wide) at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens, 256 text tokens
        cfg = dict(num_layers=24, num_kv_heads=8)
        batch, latent, text = 2, 128, 256
    model = _model(LuminaNextDiT2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the pipeline's RoPE table: a 384 x 384 grid of complex rotations (complex64, left alone by _place), sliced by
    # the patch embedder; its default proportional attention scales the softmax by the token count's log
    rope = get_2d_rotary_pos_embed_lumina(c.hidden_size // c.num_attention_heads, 384, 384)
    kwargs = dict(
        hidden_states=_randn(batch, c.in_channels, latent, latent, g=g),
        timestep=torch.full((batch,), 0.5),  # the pipeline's 1 - t / 1000
        encoder_hidden_states=_randn(batch, text, c.cross_attention_dim, g=g),
        encoder_mask=torch.ones(batch, text, dtype=torch.long),
        image_rotary_emb=rope,
        cross_attention_kwargs={"base_sequence_length": (1024 // 16) ** 2},
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _zimage(size, dtype, device):
    from diffusers import ZImageTransformer2DModel

    # one stream of caption and image tokens: a noise refiner (modulated) over the image tokens, a context refiner
    # (not modulated) over the caption's, then the joint layers; RMSNorm-modulates with tanh-gated residuals,
    # per-head RMSNorm QK norms, complex RoPE over (t, h, w), SiLU-gated feed-forwards. Its forward takes and
    # returns per-image lists (ListDiT)
    if size == "tiny":  # diffusers' test config at two heads
        cfg = dict(in_channels=16, dim=32, n_layers=1, n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=16,
                   axes_dims=[8, 4, 4], axes_lens=[256, 32, 32])
        h = w = 8
        text = 16
    else:  # Tongyi-MAI/Z-Image-Turbo (its transformer/config.json), 1024x1024: a 128 x 128 latent, 128 caption
        # tokens (a prompt's Qwen3-4B tokens; the pipeline keeps the valid ones of its 512)
        cfg = dict(in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2, n_heads=30, n_kv_heads=30,
                   cap_feat_dim=2560, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512])
        if size == "blocks2":  # two joint layers, one refiner layer of each kind
            cfg.update(n_layers=2, n_refiner_layers=1)
        h = w = 128
        text = 128
    model = ListDiT(ZImageTransformer2DModel(**cfg), lists=("hidden_states", "encoder_hidden_states"),
                    names=dict(hidden_states="x", timestep="t", encoder_hidden_states="cap_feats"))
    c = model.dit.config
    g = _gen(device)
    # the Turbo pipeline's call: guidance 0, one image; timestep (1000 - t) / 1000 in [0, 1]
    kwargs = dict(hidden_states=_randn(1, c.in_channels, 1, h, w, g=g), timestep=torch.full((1,), 0.5),
                  encoder_hidden_states=_randn(1, text, c.cap_feat_dim, g=g), return_dict=False)
    return _place(model, kwargs, dtype, device)


MODELS: Dict[str, ModelCase] = {
    "flux3": ModelCase("flux3", _flux3, "Flux3Transformer2DModel (tiny: 1 per-mode block a mode + 1 single block)"),
    "bria": ModelCase("bria", _bria, "BriaTransformer2DModel, BRIA-3.2 (tiny: 1 double + 1 single block)"),
    "bria_fibo": ModelCase("bria_fibo", _bria_fibo, "BriaFiboTransformer2DModel (tiny: 1 double + 1 single block)"),
    "bria_fibo2": ModelCase("bria_fibo2", _bria_fibo2, "BriaFibo2Transformer2DModel (tiny: 1 refiner, 1 plain + 1 "
                            "injection layer, 1 Perceiver layer)"),
    "krea2": ModelCase("krea2", _krea2, "Krea2Transformer2DModel (tiny: 1 block, 1 layerwise + 1 refiner text "
                       "block)"),
    "prx": ModelCase("prx", _prx, "PRXTransformer2DModel (tiny: 1 block)"),
    "zimage": ModelCase("zimage", _zimage, "ZImageTransformer2DModel, Z-Image-Turbo (tiny: 1 layer, 1 refiner layer "
                        "of each kind; per-image lists batched by ListDiT)"),
    "lumina_next": ModelCase("lumina_next", _lumina_next, "LuminaNextDiT2DModel, Lumina-Next (tiny: 1 layer)"),
}
