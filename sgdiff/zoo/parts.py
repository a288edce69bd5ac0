"""What every zoo builder shares (:mod:`sgdiff.zoo.image`, :mod:`sgdiff.zoo.video`): the case
record, the block-count cut of ``blocks2``, seeded inputs made on the CPU, and placing a model
and its inputs on a device in a dtype as ``from_pretrained(torch_dtype=...)`` would."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[str, torch.dtype, torch.device], Tuple[torch.nn.Module, Dict[str, Any]]]
    doc: str
    sizes: Tuple[str, ...] = ("tiny", "full", "blocks2")
    #: its full config runs forward on the meta device (its published shapes checked with no memory)
    meta: bool = True
    #: why ``blocks2`` takes fewer tokens than ``full`` (else the same inputs): eager cannot run the full ones on a GPU
    fewer_tokens: str = ""


class ListDiT(torch.nn.Module):
    """A DiT whose forward takes and returns per-sample lists (Z-Image's latents and captions,
    Wan-Animate 2's latents, text and condition latents), as the zoo's contract wants it: a batch
    in one tensor in, one out. The keyword arguments named in ``lists`` ([B, ...] tensors) are
    split into the lists its pipeline passes, the others passed as they are, each under the DiT's
    own name for it (``names``), and the output list is stacked back. With ``item_axis``, each item
    keeps a leading axis of one (Cosmos 3's per-item latents are [1, C, T, H, W]): the batch is split
    into [1, ...] items and the outputs, [1, ...] too, are concatenated. The DiT is ``.dit``."""

    def __init__(self, dit: torch.nn.Module, lists: Tuple[str, ...], names: Optional[Dict[str, str]] = None,
                 item_axis: bool = False):
        super().__init__()
        self.dit, self.lists, self.names, self.item_axis = dit, tuple(lists), dict(names or {}), item_axis
        self._keep_in_fp32_modules = getattr(dit, "_keep_in_fp32_modules", None)

    def forward(self, **kwargs):
        kwargs.pop("return_dict", None)  # a tuple out, as the zoo's other models are called
        split = (lambda v: list(v.split(1))) if self.item_axis else (lambda v: list(v.unbind(0)))
        args = {self.names.get(k, k): split(v) if k in self.lists else v for k, v in kwargs.items()}
        out = self.dit(**args, return_dict=False)[0]
        return ((torch.cat if self.item_axis else torch.stack)(out),)


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


def wan_like(cls, full: Dict[str, Any], full_inputs: Tuple[int, int, int, int], size, dtype, device):
    """A model of Wan's blocks (Wan 2.1, SkyReels-V2): one tiny config and its inputs for all of
    them; at ``full`` (and ``blocks2``) the config ``full`` with latents and text of
    ``full_inputs`` = (frames, height, width, text tokens)."""
    if size == "tiny":
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                   out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32)
        frames, height, width, text = 2, 4, 4, 6
    else:
        cfg, (frames, height, width, text) = full, full_inputs
    model = _model(cls, cfg, size)
    c = model.config
    g = _gen(device)
    kwargs = dict(
        hidden_states=_randn(1, c.in_channels, frames, height, width, g=g),
        timestep=torch.full((1,), 500.0),
        encoder_hidden_states=_randn(1, text, c.text_dim, g=g),
        return_dict=False,
    )
    return _place(model, kwargs, dtype, device)
