"""What every zoo builder shares (:mod:`sgdiff.zoo`, :mod:`sgdiff.zoo_more_dits`): the case
record, the block-count cut of ``blocks2``, seeded inputs made on the CPU, and placing a model
and its inputs on a device in a dtype as ``from_pretrained(torch_dtype=...)`` would."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[str, torch.dtype, torch.device], Tuple[torch.nn.Module, Dict[str, Any]]]
    doc: str
    sizes: Tuple[str, ...] = ("tiny", "full", "blocks2")


def _model(cls, cfg: Dict[str, Any], size: str) -> torch.nn.Module:
    """``cls(**cfg)``; at ``blocks2``, with the config's block counts cut to two blocks."""
    return cls(**(_two_blocks(cls, cfg) if size == "blocks2" else cfg))


def _two_blocks(cls, cfg: Dict[str, Any]) -> Dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters
    kinds = [k for k in ("num_layers", "num_single_layers") if k in params]
    cfg = dict(cfg, **{k: 2 // len(kinds) for k in kinds})
    if "num_refiner_layers" in params:
        cfg["num_refiner_layers"] = 1
    if "dual_attention_layers" in cfg:
        cfg["dual_attention_layers"] = (0,)
    return cfg


def _gen(device) -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _randn(*shape, g) -> torch.Tensor:
    return torch.randn(*shape, generator=g, device="cpu")  # the same inputs on every device


def _image_ids(h: int, w: int) -> torch.Tensor:
    """Flux's (and Chroma's) image position ids of an ``h`` x ``w`` latent: [h * w, 3]."""
    grid = torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(), indexing="ij")
    return torch.stack(grid, -1).reshape(-1, 3)


def _place(model, kwargs, dtype, device):
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    # as `from_pretrained(..., torch_dtype=dtype)` loads it: the modules the model names (Wan's
    # norms, modulation tables, time embedder, RoPE) keep fp32 weights
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and any(k in name.split(".") for k in keep):
            t.data = t.data.float()

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        return v

    return model, {k: move(v) for k, v in kwargs.items()}
