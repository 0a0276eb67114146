"""Single(model): no routing. The baseline, and the way to serve one model on its own."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Policy


@dataclass(frozen=True)
class Single(Policy):
    model: str

    @property
    def models(self) -> list[str]:
        return [self.model]

    @property
    def entry_model(self) -> str:
        return self.model
