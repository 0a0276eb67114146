"""R2R (2025, "R2R: Efficiently Navigating Divergent Reasoning Paths with Small-Large
Model Token Routing"): a router on the small model's last hidden state, the sampled token's
embedding and the top-100 log-probabilities predicts whether the token diverges from the large
model's; p >= threshold: the token is discarded and the large model writes one token."""

from __future__ import annotations

import torch

from .deferral import OneTokenDeferral
from .fields import HIDDEN, TOKEN_EMBEDDING


class R2R(OneTokenDeferral):
    kind = "r2r"
    requires = frozenset({HIDDEN, TOKEN_EMBEDDING})

    @staticmethod
    def defer(p: torch.Tensor, threshold: float) -> torch.Tensor:
        return p >= threshold
