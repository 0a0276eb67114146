"""Single(model): no routing. The baseline, and the way to serve one model on its own."""

from __future__ import annotations

from .base import Policy


class Single(Policy):
    def __init__(self, model: str):
        if not isinstance(model, str) or not model:
            raise ValueError("Single(model): model must be a non-empty model name")
        self.model = model

    @property
    def models(self) -> list[str]:
        return [self.model]

    def __repr__(self) -> str:
        return f"Single({self.model!r})"
