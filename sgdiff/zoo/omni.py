"""The zoo's omni-models, whose generation stream runs beside a language model's: ``build(size, dtype,
device) -> (model, kwargs)`` per model (see :mod:`sgdiff.zoo`)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Dict

import torch

from sgdiff.zoo.parts import ListDiT, ModelCase, _gen, _place, _randn


def _cosmos3(size, dtype, device):
    from diffusers import Cosmos3OmniTransformer
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

    # a mixture of transformers over one packed sequence: the prompt's tokens (a causal "understanding" pathway, a
    # Qwen3-VL decoder) and the patchified video latents with their timestep embeddings added (the "generation"
    # pathway), each with its own RMSNorms, GQA projections, per-head RMSNorm QK norms and SiLU-gated MLP in every
    # layer; the video queries attend to the prompt's keys and their own, the interleaved 3D mRoPE (rotate-half) on
    # both. Its forward takes per-item latent lists, Python ints and packed-sequence indexes and returns a list
    # (ListDiT, each item [1, C, T, H, W] as the pipeline passes it). The call built here: the conditional pass of
    # one text-to-video denoising step (Cosmos3OmniPipeline, enable_sound=False, no action), its sequence packed by
    # the pipeline's own _prepare_text_segment / _prepare_vision_segment
    if size == "tiny":  # GQA as the real 32 / 8 heads; head dim 16: the mRoPE's 8 frequencies split t/h/w 4/2/2; an
        # odd latent height (as the published 45) runs the patchifier's padding and the unpatchifier's crop
        cfg = dict(hidden_size=32, head_dim=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                   num_hidden_layers=1, latent_channel=4, patch_latent_dim=16, vocab_size=64, rope_axes_dim=[4, 2, 2])
        (frames, height, width), text = (2, 5, 4), 8
    else:  # Cosmos3-Nano (the class defaults, diffusers' documented checkpoint: two Qwen3-VL-8B-wide pathways, 36
        # layers, hidden 4096, 32 heads of 128, 8 KV heads, MLP 12288; Wan 2.2's 48-channel latents, patch 2) at the
        # pipeline's default 720x1280 x 189 frames at 24 fps: a 48 x 45 x 80 latent (16x VAE, 4x in time), its height
        # padded to 46 -> 48 x 23 x 40 = 44160 video tokens; 128 prompt tokens (the chat template's system and user
        # turns with the duration and resolution sentences, then eos and <|vision_start|>)
        cfg = dict(num_hidden_layers=2) if size == "blocks2" else dict()  # blocks2: 2 layers of both pathways
        (frames, height, width), text = (48, 45, 80), 128
    dit = Cosmos3OmniTransformer(**cfg)
    c = dit.config
    g = _gen(device)
    latents = _randn(1, c.latent_channel, frames, height, width, g=g)
    with torch.device("cpu"):  # the pipeline's packing reads its indexes back (.item(), .tolist()): made here, placed
        pipe = SimpleNamespace(transformer=dit, vae_scale_factor_temporal=4)  # what the two methods read of it
        ids = torch.randint(0, c.vocab_size, (text,), generator=g).tolist()
        text_pack = Cosmos3OmniPipeline._prepare_text_segment(pipe, ids, device="cpu")
        vision_pack = Cosmos3OmniPipeline._prepare_vision_segment(
            pipe, input_vision_tokens=latents, has_image_condition=False,
            mrope_offset=text_pack["vision_start_temporal_offset"], vision_fps=24.0, curr=text_pack["und_len"],
            device="cpu", condition_frame_indexes=[])
    kwargs = dict(
        hidden_states=latents,
        input_ids=text_pack["input_ids"],
        text_indexes=text_pack["text_indexes"],
        und_len=text_pack["und_len"],
        sequence_length=text_pack["und_len"] + vision_pack["num_vision_tokens"],
        vision_token_shapes=vision_pack["vision_token_shapes"],
        vision_sequence_indexes=vision_pack["vision_sequence_indexes"],
        vision_mse_loss_indexes=vision_pack["vision_mse_loss_indexes"],
        return_dict=False,
    )
    model = ListDiT(dit, lists=("hidden_states",), item_axis=True,
                    names=dict(hidden_states="vision_tokens", timestep="vision_timesteps"))
    model, kwargs = _place(model, kwargs, dtype, device)
    # fp32 whatever the model's dtype, as the pipeline passes them: the mRoPE positions (fps-scaled floats past the
    # 15000 modality margin) and a timestep per noisy video token (the scheduler's t in [0, 1000])
    kwargs.update(position_ids=torch.cat([text_pack["text_mrope_ids"], vision_pack["vision_mrope_ids"]], 1).to(device),
                  timestep=torch.full((vision_pack["num_noisy_vision_tokens"],), 500.0, device=device),
                  vision_noisy_frame_indexes=[i.to(device) for i in vision_pack["vision_noisy_frame_indexes"]])
    return model, kwargs


MODELS: Dict[str, ModelCase] = {
    # its RoPE runs `torch.autocast(device_type=position_ids.device.type, enabled=False)`, which the meta device
    # refuses (no autocast dtype for it); the rest of the full config's forward runs there
    "cosmos3": ModelCase("cosmos3", _cosmos3, "Cosmos3OmniTransformer, Cosmos3-Nano, one text-to-video step's "
                         "conditional pass (tiny: 1 layer of both pathways; per-item lists batched by ListDiT)",
                         meta=False),
}
