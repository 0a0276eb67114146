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
from .outputs import RequestOutput, StreamDelta, TokenLogprob
from .policies import Policy, RStitch, Single

__all__ = [
    "AutoBatchingOptions",
    "ConfigError",
    "Engine",
    "EngineNotRunningError",
    "EngineOptions",
    "InvalidRequestError",
    "ModelLoadError",
    "ModelSpec",
    "Policy",
    "RStitch",
    "RequestOutput",
    "SamplingParams",
    "Single",
    "StreamDelta",
    "TokenLogprob",
    "TokenRouterError",
]

__version__ = "0.1.0"
