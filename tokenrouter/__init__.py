"""tokenrouter: token-level routing between language models, served in-process."""

from .api import Engine
from .config import AutoBatchingOptions, EngineOptions, ModelSpec, SamplingParams
from .errors import (
    ConfigError,
    EngineNotRunningError,
    InvalidRequestError,
    ModelLoadError,
    TokenRouterError,
)
from .llm import LLM
from .metrics import EngineMetrics
from .outputs import RequestOutput, StreamDelta
from .policies import Policy, RStitch, Single

__all__ = [
    "AutoBatchingOptions",
    "ConfigError",
    "Engine",
    "EngineMetrics",
    "EngineNotRunningError",
    "EngineOptions",
    "InvalidRequestError",
    "LLM",
    "ModelLoadError",
    "ModelSpec",
    "Policy",
    "RStitch",
    "RequestOutput",
    "SamplingParams",
    "Single",
    "StreamDelta",
    "TokenRouterError",
]

__version__ = "0.1.0"
