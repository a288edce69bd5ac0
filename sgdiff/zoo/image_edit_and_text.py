"""More image DiTs: ERNIE-Image, Ideogram 4, JoyImage-Edit and JoyImage-Edit-Plus (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo.parts import ModelCase, _gen, _model, _place, _randn


def _unzero(model: torch.nn.Module, device) -> None:
    """Weights a checkpoint would fill but the class initialises to zeros (ERNIE's adaLN and final linear,
    JoyImage's modulation tables): random (seeded), so the output depends on every block."""
    if torch.device(device).type == "meta":
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.any():
                p.normal_(0.0, 0.02)


def _ernie_image(size, dtype, device):
    from diffusers import ErnieImageTransformer2DModel

    if size == "tiny":
        cfg = dict(hidden_size=32, num_attention_heads=2, num_layers=1, ffn_hidden_size=64, in_channels=4,
                   out_channels=4, patch_size=1, text_in_dim=16, rope_axes_dim=(4, 6, 6))
        latent, text, lens = 8, 6, [4, 6]
    else:  # ERNIE-Image (baidu/ERNIE-Image transformer: the class defaults, 24 layers 3072 wide, 2560-wide text) at
        # 1024x1024: 16x VAE -> 64x64 latent (128 channels), patch 1; CFG batch: the negative and the prompt
        cfg, (latent, text, lens) = dict(), (64, 256, [8, 256])
    model = _model(ErnieImageTransformer2DModel, cfg, size)
    _unzero(model, device)
    c = model.config
    g = _gen(device)
    valid = torch.arange(text, device="cpu")[None] < torch.tensor(lens, device="cpu")[:, None]
    kwargs = dict(
        hidden_states=_randn(2, c.in_channels, latent, latent, g=g),
        timestep=torch.full((2,), 500.0),  # the scheduler's t, in the model's dtype
        # the pipeline's _pad_text: each prompt's hidden states, zero-padded to the longest
        text_bth=_randn(2, text, c.text_in_dim, g=g) * valid[..., None],
        text_lens=torch.tensor(lens),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _ideogram4(size, dtype, device):
    from diffusers import Ideogram4Transformer2DModel

    if size == "tiny":
        cfg = dict(in_channels=8, num_layers=1, attention_head_dim=16, num_attention_heads=2, intermediate_size=64,
                   adaln_dim=16, llm_features_dim=32, mrope_section=(3, 3, 2))
        grid, text, n = 4, 6, 4
    else:  # Ideogram 4 (the class defaults: 34 layers, 18 x 256 wide, SwiGLU 12288, 53248-wide stacked text
        # features) at 1024x1024: 16x VAE x patch 2 -> 64x64 image tokens; the pipeline's 2048 text slots
        cfg, (grid, text, n) = dict(), (64, 2048, 300)
    model = _model(Ideogram4Transformer2DModel, cfg, size)
    c = model.config
    g = _gen(device)
    # the pipeline's packed [left pad][text][image] layout (_prepare_ids) with n prompt tokens (made on the CPU, as
    # the latents and features they mask)
    ar = torch.arange(max(grid, n), device="cpu")
    image = torch.stack(torch.meshgrid(ar[:1] * 0, ar[:grid], ar[:grid], indexing="ij"), -1).reshape(-1, 3) + 65536
    pad = text - n
    position_ids = torch.cat([image.new_zeros(pad, 3), ar[:n, None].expand(n, 3), image])[None]
    indicator = torch.tensor([0] * pad + [3] * n + [2] * grid * grid, device="cpu")[None]
    segment_ids = torch.where(indicator == 0, -1, 1)
    features = _randn(1, text + grid * grid, c.llm_features_dim, g=g) * (indicator == 3)[..., None]
    latents = _randn(1, grid * grid, c.in_channels, g=g)
    kwargs = dict(
        hidden_states=torch.cat([latents.new_zeros(1, text, c.in_channels), latents], 1),
        timestep=torch.full((1,), 0.5),  # model time in [0, 1]
        encoder_hidden_states=features,
        position_ids=position_ids,
        segment_ids=segment_ids,
        indicator=indicator,
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


_JOY_TINY = dict(patch_size=[1, 2, 2], in_channels=4, hidden_size=32, num_attention_heads=2, text_dim=16,
                 num_layers=1, rope_dim_list=[4, 6, 6])


def _joyimage(size, dtype, device):
    from diffusers import JoyImageEditTransformer3DModel

    if size == "tiny":
        cfg, (latent, text) = dict(_JOY_TINY), (8, 6)
    else:  # JoyImage-Edit (jdopensource/JoyImage-Edit transformer: the class defaults, 20 double blocks 3072 wide,
        # Qwen3-VL 4096 text) at 1024x1024: 128x128 latent, patch 2 -> 4096 tokens an item; 512 text tokens
        cfg, (latent, text) = dict(), (128, 512)
    model = _model(JoyImageEditTransformer3DModel, cfg, size)
    _unzero(model, device)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        # the edit pipeline's items: [reference image latents, noise], one frame each
        hidden_states=_randn(1, 2, c.in_channels, 1, latent, latent, g=g),
        timestep=torch.full((1,), 500.0),
        encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


def _joyimage_edit_plus(size, dtype, device):
    from diffusers import JoyImageEditPlusTransformer3DModel

    if size == "tiny":
        cfg, (target, ref, text, valid) = dict(_JOY_TINY), ((4, 4), (2, 4), 6, 5)
    else:  # JoyImage-Edit-Plus (the class defaults, as JoyImage-Edit) at 1024x1024: a 64x64 patch target and a
        # 768x1024 reference (48x64 patches); 512 text tokens
        cfg, (target, ref, text, valid) = dict(), ((64, 64), (48, 64), 512, 400)
    model = _model(JoyImageEditPlusTransformer3DModel, cfg, size)
    _unzero(model, device)
    c = model.config
    g = _gen(device)
    pt, ph, pw = c.patch_size
    n = target[0] * target[1] + ref[0] * ref[1]
    # one sample: no padding (a batch pads each sample's patches, and F.pad its RoPE tables, to the longest)
    patches = _randn(1, n, c.in_channels, pt, ph, pw, g=g)
    kwargs = dict(
        hidden_states=patches,  # [B, patches, C, pt, ph, pw]: target then reference, each patchified
        timestep=torch.full((1,), 500.0),
        encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
        encoder_hidden_states_mask=(torch.arange(text) < valid).long()[None],
        shape_list=[[(1, *target), (1, *ref)]],
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)


MODELS: Dict[str, ModelCase] = {
    "ernie_image": ModelCase("ernie_image", _ernie_image, "ErnieImageTransformer2DModel (tiny: 1 layer, CFG batch)",
        meta=False),
    "ideogram4": ModelCase("ideogram4", _ideogram4, "Ideogram4Transformer2DModel (tiny: 1 layer, packed text + image)",
        meta=False),
    "joyimage": ModelCase("joyimage", _joyimage, "JoyImageEditTransformer3DModel (tiny: 1 double block, 2 items)"),
    "joyimage_edit_plus": ModelCase("joyimage_edit_plus", _joyimage_edit_plus, "JoyImageEditPlusTransformer3DModel "
                                    "(tiny: 1 double block, target + reference patches)"),
}
