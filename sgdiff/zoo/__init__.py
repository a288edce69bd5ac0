"""diffusers DiTs with random weights and matching inputs, for the demo, tests and benchmarks.

``build("flux", size="tiny")`` returns ``(model, kwargs)``; ``model(**kwargs)`` runs one
denoising step. ``tiny`` configs keep every chain the real model has (one block of each kind)
at toy widths; ``full`` configs are the published architectures with random weights, at a
published resolution; ``blocks2`` is ``full`` with two blocks (one of each kind where the model
has two kinds): the real widths and inputs, where launch time weighs as much as the kernels.
Needs diffusers (the ``test`` or ``bench`` extra).
"""
from __future__ import annotations

from typing import Dict

import torch

from sgdiff.zoo import (image, image_edit_and_text, image_extra, image_more, omni, video, video_extra, video_more,
                        video_world)
from sgdiff.zoo.parts import ModelCase, _image_ids
from sgdiff.zoo.pipelines import _flux_vae, _wan_vae, build_pipeline  # noqa: F401 (the zoo's API)

MODELS: Dict[str, ModelCase] = {**image.MODELS, **image_more.MODELS, **image_edit_and_text.MODELS,
                                 **image_extra.MODELS, **video.MODELS, **video_more.MODELS, **video_extra.MODELS,
                                 **omni.MODELS, **video_world.MODELS}


def build(name: str, size: str = "tiny", dtype: torch.dtype = torch.float32,
          device: "torch.device | str" = "cpu", seed: int = 0):
    """``(model, kwargs)`` for model ``name`` with random weights (seeded)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if size not in MODELS[name].sizes:
        raise ValueError(f"{name} comes in sizes {MODELS[name].sizes}, not {size!r}")
    torch.manual_seed(seed)
    with torch.device(device):  # weights are made where they run (a full Flux is 12 B parameters)
        return MODELS[name].build(size, dtype, torch.device(device))


def flux_inputs_at(kwargs: dict, side: int) -> dict:
    """Flux's (or Chroma's) ``kwargs`` at a ``side`` x ``side`` latent: fresh random latents of
    that token count (``kwargs``' batch, channels, dtype and device) and their position ids."""
    x = kwargs["hidden_states"]
    return dict(kwargs, hidden_states=torch.randn(x.shape[0], side * side, x.shape[-1], device=x.device, dtype=x.dtype),
                img_ids=_image_ids(side, side).to(x.device))
