"""Quality tiers and numerical contracts.

Every op implementation declares a *contract*: how its output relates to the eager chain it
replaces. A *tier* admits a set of contracts. Tiers are cumulative: `high` admits everything
`extra-high` does, which admits everything `lossless` does.

This module is a leaf: it imports nothing from the rest of sgdiff (nor torch), so every layer
may use it.
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
from typing import Iterator, Optional


class Contract(str, enum.Enum):
    """How an op implementation's output relates to the eager chain's."""

    #: reproduces every rounding step of the eager chain: ``torch.equal`` holds.
    BITEXACT = "bitexact"
    #: differs only in half-precision rounding order (one fp32 pass, one final rounding).
    CLOSE = "close"
    #: lower precision or another algorithm (Inductor codegen, approximations).
    APPROX = "approx"

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]


_STRICTNESS = {Contract.BITEXACT: 0, Contract.CLOSE: 1, Contract.APPROX: 2}


class Tier(str, enum.Enum):
    LOSSLESS = "lossless"
    EXTRA_HIGH = "extra-high"
    HIGH = "high"

    def admits(self, contract: Contract | str) -> bool:
        return Contract(contract) in TIER_CONTRACTS[self]

    @classmethod
    def parse(cls, value: "Tier | str") -> "Tier":
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(repr(t.value) for t in cls)
            raise ValueError(f"unknown sgdiff quality {value!r}; valid: {valid}") from None


TIER_CONTRACTS = {
    Tier.LOSSLESS: frozenset({Contract.BITEXACT}),
    Tier.EXTRA_HIGH: frozenset({Contract.BITEXACT, Contract.CLOSE}),
    Tier.HIGH: frozenset({Contract.BITEXACT, Contract.CLOSE, Contract.APPROX}),
}

DEFAULT_TIER = Tier.LOSSLESS

_call_tier: contextvars.ContextVar[Optional[Tier]] = contextvars.ContextVar(
    "sgdiff_call_tier", default=None
)


@contextlib.contextmanager
def quality(tier: Tier | str) -> Iterator[Tier]:
    """Per-call tier switch: ``with sgdiff.quality("high"): model(x)``.

    Code compiled by sgdiff keeps one compiled variant per tier and runs the variant of the
    tier in force; variants are never shared between tiers.
    """
    token = _call_tier.set(Tier.parse(tier))
    try:
        yield _call_tier.get()
    finally:
        _call_tier.reset(token)


def current_call_tier() -> Optional[Tier]:
    """The tier set by an enclosing :func:`quality` block, or None."""
    return _call_tier.get()
