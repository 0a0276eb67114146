"""tokenrouter: token-level routing between language models, served in-process."""

from .api import Engine
from .config import (
    AutoBatchingOptions,
    EngineOptions,
    Grammar,
    JsonSchema,
    ModelSpec,
    RayPlacement,
    Regex,
    SamplingParams,
)
from .errors import (
    ConfigError,
    ContextLengthExceededError,
    EngineNotRunningError,
    InvalidRequestError,
    ModelLoadError,
    TokenRouterError,
)
from .llm import LLM
from .metrics import EngineMetrics
from .outputs import RequestOutput, StreamDelta, TokenLogprob, ToolCall
from .policies import Policy, RStitch, Single

__version__ = "0.1.0"

__all__ = ["AutoBatchingOptions", "ConfigError", "ContextLengthExceededError", "Engine", "EngineMetrics"]
__all__ += ["EngineNotRunningError", "EngineOptions", "Grammar", "InvalidRequestError", "JsonSchema", "LLM"]
__all__ += ["ModelLoadError", "ModelSpec", "Policy", "RStitch", "RayPlacement", "Regex", "RequestOutput"]
__all__ += ["SamplingParams", "Single", "StreamDelta", "TokenLogprob", "TokenRouterError", "ToolCall"]
