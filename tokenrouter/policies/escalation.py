"""Escalation over two or more models (usually three), smallest first (the paper's ME-style setting, e.g.
Qwen3 0.6B/8B/32B): a model whose normalized entropy exceeds its threshold discards its token
and escalates to the next larger model; the largest always accepts; after an accepted token,
control returns to the smallest."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from .base import Policy, Route, StepResult
from .fields import ENTROPY


class Escalation(Policy):
    requires = frozenset({ENTROPY})

    def __init__(self, models: Sequence[str], taus: Sequence[float]):
        models, taus = list(models), list(taus)
        if len(models) < 2 or len(set(models)) != len(models) or not all(isinstance(m, str) and m for m in models):
            raise ConfigError(f"Escalation: models must be two or more distinct names, smallest first, got {models}")
        if len(taus) != len(models) - 1:
            raise ConfigError(
                f"Escalation: give one tau per model but the largest ({len(models) - 1}), got {len(taus)}"
            )
        for i, tau in enumerate(taus):
            if isinstance(tau, bool) or not isinstance(tau, (int, float)) or math.isnan(tau) or not 0 <= tau <= 1:
                raise ConfigError(f"Escalation: taus[{i}] must be a normalized entropy in [0, 1], got {tau!r}")
        self._models = models
        self.taus = torch.tensor([float(t) for t in taus] + [math.inf])  # the largest never escalates

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def route(self, result: StepResult) -> Route:
        i = result.model_index
        escalate = result.entropy.cpu() > self.taus[i]
        next_model = torch.where(escalate, i + 1, 0)
        return Route(keep=~escalate, next_model=next_model)

    def __repr__(self) -> str:
        return f"Escalation(models={self._models}, taus={self.taus[:-1].tolist()})"
