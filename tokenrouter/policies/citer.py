"""CITER ("CITER: Collaborative Inference for Efficient Large Language Model Decoding with
Token-Level Routing", 2025): an MLP on the small model's last hidden state gives a confidence that its
token is right; below the threshold (0.9 in its README) the token is discarded and the large
model writes one token."""

from __future__ import annotations

import torch

from .deferral import OneTokenDeferral


class CITER(OneTokenDeferral):
    kind = "citer"

    @staticmethod
    def defer(p: torch.Tensor, threshold: float) -> torch.Tensor:
        return p < threshold
