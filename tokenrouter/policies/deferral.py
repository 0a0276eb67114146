"""What CITER, R2R and CoLLM share: the small model writes; where its router says so, the small
model's token is discarded, the large model writes that one token, and control returns."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..errors import ConfigError
from .base import Policy, Route, StepResult
from .fields import HIDDEN
from .routers import RouterKind, RouterNet, check_pair, load_router, router_features


class OneTokenDeferral(Policy):
    kind: RouterKind
    requires = frozenset({HIDDEN})

    def __init__(
        self,
        router: str | Path | RouterNet,
        threshold: float | None = None,
        small: str = "small",
        large: str = "large",
    ):
        name = type(self).__name__
        if isinstance(router, RouterNet):
            if router.config.kind != self.kind:
                raise ConfigError(f"{name}: router is a {router.config.kind!r} router, not a {self.kind!r} one")
            self.router = router.eval()
        else:
            self.router = load_router(router, self.kind)
        if threshold is None:
            threshold = self.router.config.threshold  # the one picked when it was trained
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"{name}: threshold must be a number in [0, 1], got {threshold!r}")
        if math.isnan(threshold):
            raise ConfigError(f"{name}: threshold must not be NaN")
        if small == large:
            raise ConfigError(f"{name}: small and large must be different models")
        self.threshold = float(threshold)
        self.small, self.large = small, large
        self.device = next(self.router.parameters()).device  # where the network is now

    def follow(self, device: torch.device) -> None:
        """Move the network to the device the step's hidden states are on (once: it stays)."""
        if device != self.device:
            self.router.to(device)
            self.device = device

    @property
    def models(self) -> list[str]:
        return [self.small, self.large]

    def validate(self, models: dict) -> None:
        check_pair(self.router, models[self.small].model, models[self.large].model, (self.small, self.large))

    def probability(self, result: StepResult) -> torch.Tensor:
        """The router's output for each row of a small-model step."""
        cfg = self.router.config
        features = router_features(cfg.kind, result.hidden, result.token_embedding, result.logits, cfg.top_k)
        self.follow(features.device)
        return self.router.probability(features)

    @staticmethod
    def defer(p: torch.Tensor, threshold: float) -> torch.Tensor:
        """Rows whose token the large model writes instead, for router outputs p (training picks
        thresholds with this same comparison)."""
        raise NotImplementedError

    def route(self, result: StepResult) -> Route:
        if result.model == self.large:  # one token, then back to the small model
            keep = torch.ones(len(result), dtype=torch.bool)
            return Route(keep=keep, next_model=torch.zeros(len(result), dtype=torch.long))
        deferred = self.defer(self.probability(result), self.threshold).cpu()
        return Route(keep=~deferred, next_model=deferred.long())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(threshold={self.threshold}, small={self.small!r}, large={self.large!r})"
