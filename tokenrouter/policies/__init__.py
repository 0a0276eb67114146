"""Routing policies: which model writes each token."""

from .base import (
    ENTROPY,
    HIDDEN,
    STEP_FIELDS,
    TOKEN_EMBEDDING,
    PeerMessage,
    Policy,
    Route,
    StepResult,
    normalized_entropy,
)
from .citer import CITER
from .collm import CoLLM
from .escalation import Escalation
from .r2r import R2R
from .rstitch import RStitch
from .single import Single

__all__ = [
    "CITER",
    "CoLLM",
    "Escalation",
    "R2R",
    "ENTROPY",
    "HIDDEN",
    "PeerMessage",
    "Policy",
    "RStitch",
    "Route",
    "STEP_FIELDS",
    "Single",
    "StepResult",
    "TOKEN_EMBEDDING",
    "normalized_entropy",
]
