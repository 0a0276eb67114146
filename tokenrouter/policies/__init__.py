"""Routing policies: which model writes each token."""

from .base import Policy
from .single import Single

__all__ = ["Policy", "Single"]
