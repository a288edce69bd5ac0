"""Example inputs an op declares: the arguments it meets in models, at their real sizes.

An op module lists :class:`Example` s in its :class:`~sgdiff.kernels.registry.OpDef`. Each
makes the op's arguments from named sizes (``make(t)``, reading ``t.S``, drawing
``t.randn(...)``), at the model's sizes for the GPU (the kernel bench, the GPU tests) or at
``small`` ones on the CPU (the sm_90 compile test, the interpreter). Nothing here knows the
tests or the bench: they read the examples.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Mapping, Optional, Sequence

import torch

DEFAULT_SMALL = {"S": 64}  # what a CPU check shrinks by default: the tokens


class Inputs:
    """Sizes by name (``t.S``) and seeded random tensors on one device."""

    def __init__(self, sizes: Mapping[str, int], device="cpu", seed: int = 0):
        self._sizes = dict(sizes)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def __getattr__(self, name: str) -> int:
        try:
            return self.__dict__["_sizes"][name]
        except KeyError:
            raise AttributeError(name) from None

    def randn(self, *shape, dtype=torch.bfloat16, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        x = torch.randn(*shape, device=self.device, generator=self.generator)
        if scale != 1.0 or shift != 0.0:
            x = x * scale + shift
        return x.to(dtype)

    def rand(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.rand(*shape, device=self.device, generator=self.generator).to(dtype)

    def heads(self, dtype=torch.bfloat16) -> torch.Tensor:
        """A ``[B, S, H D]`` projection viewed ``[B, H, D, S]``, as Sana's linear attention views
        its q, k and v."""
        return self.randn(self.B, self.S, self.H * self.D, dtype=dtype).transpose(1, 2).unflatten(1, (self.H, self.D))

    def chunks(self, B: int, D: int, n: int, dtype=torch.bfloat16):
        """n ``[B, 1, D]`` chunk views of one ``[B, n D]`` projection: adaLN's
        ``emb.chunk(n, dim=1)`` then ``[:, None]`` (Flux, SD3)."""
        return [c[:, None] for c in self.randn(B, n * D, dtype=dtype).chunk(n, dim=1)]

    def table_chunks(self, B: int, D: int, n: int, dtype=torch.bfloat16):
        """n ``[B, 1, D]`` chunks of a ``[B, n, D]`` table (Sana, PixArt, Wan:
        ``(table[None] + temb.reshape(B, n, D)).chunk(n, dim=1)``)."""
        return list(self.randn(B, n, D, dtype=dtype).chunk(n, dim=1))

    def table_rows(self, B: int, D: int, n: int, dtype=torch.bfloat16):
        """LTX-Video's ``(table[None, None] + temb.reshape(B, 1, n, D)).unbind(dim=2)``: strided rows."""
        table, temb = self.randn(n, D, dtype=dtype), self.randn(B, 1, n * D, dtype=dtype)
        return list((table[None, None] + temb.reshape(B, 1, n, D)).unbind(dim=2))

    def modulation(self, B: int, S: int, D: int, form: str, dtype=torch.bfloat16):
        """``(scale, shift)`` as adaLN hands them over: ``chunk`` (Flux, SD3: ``[B, 1, D]`` views
        of one projection), ``table`` (Sana, PixArt, Wan: ``[B, 1, D]`` chunks of a ``[B, 6, D]``
        table) or ``per_token`` (``[B, S, D]`` halves of a projection)."""
        if form == "chunk":
            shift, scale = self.chunks(B, D, 6, dtype)[:2]
        elif form == "table":
            shift, scale = self.table_chunks(B, D, 6, dtype)[:2]
        elif form == "per_token":
            scale, shift = self.randn(B, S, 2 * D, dtype=dtype).chunk(2, dim=-1)
        else:
            raise ValueError(f"unknown modulation form {form!r}")
        return scale, shift

    def per_token_table(self, B: int, S: int, D: int, n: int, dtype=torch.bfloat16):
        """A per-token adaLN's operands (Wan 2.2 TI2V: a timestep per token), each of the n
        modulation tensors as the two views eager sums: ``(table.unsqueeze(0) +
        temb.float()).chunk(n, dim=2)`` then ``.squeeze(2)``, an fp32 ``[1, n, D]`` table and a
        ``[B, S, n, D]`` embedding: ``[(table_view, temb_view), ...]``."""
        table, temb = self.randn(1, n, D, dtype=torch.float32), self.randn(B, S, n, D, dtype=dtype)
        wide = table.unsqueeze(0).expand(B, S, n, D)
        return [(wide[:, :, i], temb[:, :, i]) for i in range(n)]

    def polar(self, *shape) -> torch.Tensor:
        """A complex RoPE table (``torch.polar`` of random radii near 1 and random angles)."""
        return torch.polar(self.rand(*shape) + 0.5, self.randn(*shape, dtype=torch.float32))


@dataclasses.dataclass(frozen=True)
class Example:
    """One input the op meets in a model.

    ``make(t)`` returns the op's arguments (positional, in the op's order). ``sizes`` are the
    model's; ``small`` overrides them for CPU checks (default: 64 tokens). ``chain(*args)``
    returns the model's own spelling of the eager chain on those arguments, a callable of no
    arguments (default: the op's reference). ``moved(args, out)`` names the tensors whose bytes
    any implementation must read or write once (default: the output and every tensor argument
    of the output's size), which the bench copies as its floor. ``own_kernel(*args)``, where the
    op also runs another library's kernel (a convolution), returns sgdiff's part alone as a
    callable. ``bench``: whether the kernel bench times it (every example is tested).
    """

    label: str
    sizes: Mapping[str, int]
    make: Callable[[Inputs], tuple]
    small: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SMALL))
    chain: Optional[Callable[..., Callable[[], torch.Tensor]]] = None
    moved: Optional[Callable[[tuple, torch.Tensor], Sequence[torch.Tensor]]] = None
    own_kernel: Optional[Callable[..., Callable[[], object]]] = None
    bench: bool = True

    def args(self, device="cpu", small: bool = False, seed: int = 0, cap: Optional[int] = None,
             tokens: Optional[int] = None) -> tuple:
        """The arguments at the model's sizes, or at the ``small`` ones; ``cap`` bounds every size
        and ``tokens`` sets ``S`` where the example has one (the interpreter's checks: it runs
        each program on the host)."""
        sizes: Dict[str, int] = {**self.sizes, **(self.small if small else {})}
        if cap is not None:
            sizes = {name: min(size, cap) for name, size in sizes.items()}
        if tokens is not None and "S" in sizes:
            sizes["S"] = min(sizes["S"], tokens)
        return self.make(Inputs(sizes, device, seed))

    def moved_tensors(self, args: tuple, out: torch.Tensor) -> Sequence[torch.Tensor]:
        if self.moved is not None:
            return self.moved(args, out)
        return [out] + [a for a in args if isinstance(a, torch.Tensor) and a.numel() == out.numel()]


def read_first(args: tuple, out: torch.Tensor):
    """``moved`` of an op that reads its first argument once and writes its output."""
    return [args[0], out]


def twice_out(args: tuple, out: torch.Tensor):
    """``moved`` of an op whose inputs together are as large as its output (a cat, a
    convolution's output read back): the output's bytes read and written."""
    return [out, out]
