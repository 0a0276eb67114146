"""Validated configuration: how to sample a request, how to run a model, and how the engine runs
its workers.

All are pydantic models so that bad values fail at construction with the field named.
Numbers and flags are strict: an int field takes an int (not a bool, a float or a numeric
string), a float field takes an int or a float (not a bool or a string, never NaN or an
infinity), and a flag takes a bool (not 0/1 or "yes").
"""

from .engine import AutoBatchingOptions, EngineOptions
from .model import DType, ModelSpec, RayPlacement
from .sampling import Grammar, JsonSchema, Regex, ResponseFormat, SamplingParams

__all__ = ["AutoBatchingOptions", "DType", "EngineOptions", "Grammar", "JsonSchema", "ModelSpec", "RayPlacement"]
__all__ += ["Regex", "ResponseFormat", "SamplingParams"]
