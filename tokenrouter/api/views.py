"""What a caller reads of an engine: plain values made when asked, never the engine's own parts.

`EngineInfo` (from `Engine.info()`) says what the engine serves: its policy, each model's spec and,
once loaded, what the model computes in and runs on, and the latency profiles it plans with.
`EngineHealth` and `ModelStats` are `health()`'s and `stats()`'s answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from ..autobatch import LatencyProfile, ThroughputPrediction
from ..config import ModelSpec
from ..engine import LoadedModel, WorkerStats
from ..policies import Policy


@dataclass(frozen=True)
class ModelInfo:
    """One model the engine serves: its spec as given and, once the engine has started, what it
    loaded as (None before `start()` and after `close()`)."""

    name: str
    spec: ModelSpec  # path, device, KV budget, quantization, ... as checked at construction
    precision: str | None = None  # what it computes in, and why (engine/quant/precision.py); "" unsaid
    linear_kernel: str | None = None  # what its linear layers run on ("onednn", "blocks+...", "torch")
    dtype: torch.dtype | None = None
    kv_dtype: torch.dtype | None = None  # what its KV cache holds
    device: torch.device | None = None
    tokenizer: object | None = None
    vocab_size: int | None = None
    max_model_len: int | None = None
    eos_token_ids: frozenset[int] = frozenset()

    @property
    def loaded(self) -> bool:
        return self.dtype is not None

    @classmethod
    def of(cls, name: str, spec: ModelSpec, loaded: LoadedModel | None) -> ModelInfo:
        if loaded is None:
            return cls(name, spec)
        return cls(
            name,
            spec,
            precision=loaded.precision,
            linear_kernel=loaded.linear_kernel,
            dtype=loaded.dtype,
            kv_dtype=loaded.kv,
            device=loaded.device,
            tokenizer=loaded.tokenizer,
            vocab_size=loaded.vocab_size,
            max_model_len=loaded.max_model_len,
            eos_token_ids=frozenset(loaded.eos_token_ids),
        )


@dataclass(frozen=True)
class EngineInfo:
    """What an engine serves, read-only: `Engine.info()`."""

    policy: Policy  # the routing policy (the one given, or the default)
    models: Mapping[str, ModelInfo]  # every model, in the order given
    profiles: Mapping[str, LatencyProfile]  # step-latency profiles measured or read so far (`profile()`)
    running: bool

    @property
    def entry_model(self) -> str:
        """The model a request starts on."""
        return self.policy.entry_model

    @property
    def tokenizer(self):
        """The entry model's tokenizer (every routed model shares its vocabulary); None before start."""
        return self.models[self.entry_model].tokenizer

    @classmethod
    def of(cls, policy: Policy, specs: Mapping[str, ModelSpec], loaded: Mapping[str, LoadedModel], profiles, running):
        models = {name: ModelInfo.of(name, spec, loaded.get(name)) for name, spec in specs.items()}
        return cls(policy, MappingProxyType(models), MappingProxyType(dict(profiles)), running)


@dataclass
class ModelStats(WorkerStats):
    """A worker's statistics, and with delayed_batching="auto" the throughput model's current
    choice and prediction (the same object for every model)."""

    throughput_prediction: ThroughputPrediction | None = None


@dataclass(frozen=True)
class EngineHealth:
    healthy: bool  # running, with every worker alive
    running: bool  # started and not closed
    workers: dict[str, str]  # per model: "ok", "stopped", "stuck: ..." or the error that killed it
