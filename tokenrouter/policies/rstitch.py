"""RStitch: entropy-gated stitching of a small and a large model (R-Stitch).

On the small model, a token whose normalized entropy exceeds tau is discarded and the large
model writes that position. The large model keeps writing while its own entropy exceeds tau; its
first token with entropy <= tau is kept and control returns to the small model.
"""

from __future__ import annotations

import torch

from .base import Policy, Route, StepResult
from .fields import ENTROPY


class RStitch(Policy):
    requires = frozenset({ENTROPY})

    def __init__(self, tau: float = 0.03, small: str = "small", large: str = "large"):
        if not (0.0 <= tau <= 1.0):
            raise ValueError(f"RStitch: tau must be in [0, 1] (normalized entropy), got {tau}")
        if small == large:
            raise ValueError("RStitch: small and large must be different models")
        self.tau = float(tau)
        self.small = small
        self.large = large

    @property
    def models(self) -> list[str]:
        return [self.small, self.large]

    def route(self, result: StepResult) -> Route:
        confident = (result.entropy <= self.tau).cpu()  # one read: the engine takes the answer to the host
        next_model = (~confident).long()  # 0 = small, 1 = large
        if result.model == self.small:
            return Route(keep=confident, next_model=next_model)
        return Route(keep=torch.ones_like(confident), next_model=next_model)

    def __repr__(self) -> str:
        return f"RStitch(tau={self.tau}, small={self.small!r}, large={self.large!r})"
