"""Routing policies: which model writes each token."""

from .base import ENTROPY, PeerMessage, Policy, Route, StepResult, normalized_entropy
from .rstitch import RStitch
from .single import Single

__all__ = [
    "ENTROPY",
    "PeerMessage",
    "Policy",
    "RStitch",
    "Route",
    "Single",
    "StepResult",
    "normalized_entropy",
]
