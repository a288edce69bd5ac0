"""diffusers DiTs with random weights and matching inputs, for the demo, tests and benchmarks.

``build("flux", size="tiny")`` returns ``(model, kwargs)``; ``model(**kwargs)`` runs one
denoising step. ``tiny`` configs keep every chain the real model has (one block of each kind)
at toy widths; ``full`` configs are the published architectures with random weights.
Needs diffusers (the ``test`` or ``bench`` extra).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[str, torch.dtype, torch.device], Tuple[torch.nn.Module, Dict[str, Any]]]
    doc: str
    sizes: Tuple[str, ...] = ("tiny", "full")


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
    model = FluxTransformer2DModel(**cfg)
    g = _gen(device)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(), indexing="ij"), -1)
    kwargs = dict(
        hidden_states=_randn(batch, h * w, cfg["in_channels"] if "in_channels" in cfg else 64, g=g),
        encoder_hidden_states=_randn(batch, text, cfg.get("joint_attention_dim", 4096), g=g),
        pooled_projections=_randn(batch, cfg.get("pooled_projection_dim", 768), g=g),
        timestep=torch.full((batch,), 0.5),
        img_ids=img_ids.reshape(-1, 3).float(),
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
    model = SanaTransformer2DModel(**cfg)
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
        cfg = dict(sample_size=128, use_additional_conditions=False)
        batch, latent, text = 2, 128, 300
    model = PixArtTransformer2DModel(**cfg)
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


MODELS: Dict[str, ModelCase] = {
    "flux": ModelCase("flux", _flux, "FluxTransformer2DModel",
                      sizes=("tiny", "small", "full")),
    "sana": ModelCase("sana", _sana, "SanaTransformer2DModel"),
    "pixart": ModelCase("pixart", _pixart, "PixArtTransformer2DModel"),
}


def build(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32,
          device: "torch.device | str" = "cpu", seed: int = 0):
    """``(model, kwargs)`` for model ``name`` with random weights (seeded)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if size not in MODELS[name].sizes:
        raise ValueError(f"{name} comes in sizes {MODELS[name].sizes}, not {size!r}")
    torch.manual_seed(seed)
    return MODELS[name].build(size, dtype, torch.device(device))


def _gen(device) -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _randn(*shape, g) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _place(model, kwargs, dtype, device):
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        return v

    return model, {k: move(v) for k, v in kwargs.items()}
