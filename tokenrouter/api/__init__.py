"""The caller's side: `Engine` (its lifecycle and public calls) and what turns a caller's input
into requests for the workers and their events back into outputs."""

from .engine import Engine, EngineHealth, ModelStats

__all__ = ["Engine", "EngineHealth", "ModelStats"]
