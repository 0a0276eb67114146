"""CoLLM (Co-LLM: "Learning to Decode Collaboratively with Multiple Language Models", 2024):
a learned deferral probability from the base (small) model's last hidden state; p > threshold:
the large (assistant) model writes one token."""

from __future__ import annotations

import torch

from .deferral import OneTokenDeferral


class CoLLM(OneTokenDeferral):
    kind = "collm"

    @staticmethod
    def defer(p: torch.Tensor, threshold: float) -> torch.Tensor:
        return p > threshold
