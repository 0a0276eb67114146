"""The caller's side: `Engine` (its lifecycle and public calls) and what turns a caller's input
into requests for the workers and their events back into outputs."""

from .engine import Engine
from .prompts import CHAT_ROLES, Prompt, chat_ids
from .setup import first_error, spec_in_precision
from .tool_calls import ToolChoice
from .views import EngineHealth, EngineInfo, ModelInfo, ModelStats

__all__ = ["Engine", "EngineHealth", "ModelStats", "CHAT_ROLES", "Prompt", "ToolChoice", "chat_ids", "first_error"]
__all__ += ["spec_in_precision", "EngineInfo", "ModelInfo"]
