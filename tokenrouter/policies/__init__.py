"""Routing policies: which model writes each token."""

from .base import ENTROPY, HIDDEN, PeerMessage, Policy, Route, StepResult, normalized_entropy
from .rstitch import RStitch
from .single import Single

__all__ = [
    "ENTROPY",
    "HIDDEN",
    "PeerMessage",
    "Policy",
    "RStitch",
    "Route",
    "Single",
    "StepResult",
    "normalized_entropy",
]
