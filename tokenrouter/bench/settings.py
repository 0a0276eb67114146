"""What a benchmark is asked to do, checked before anything loads: a bad knob fails in a second,
not after minutes of loading models."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, TokenRouterError
from ..policies import Policy
from .systems import SYSTEMS
from .workloads import WorkloadSpec


class BenchError(TokenRouterError):
    """A benchmark that cannot run as asked, or a request in it failed."""


@dataclass
class BenchConfig:
    """Everything a benchmark run needs. `models` maps the policy's model names to paths."""

    models: dict[str, str | Path]
    policy: Policy
    workloads: list[WorkloadSpec]
    # more ModelSpec fields per model name, in every system that loads it (e.g. {"small8":
    # {"quantization": "int8"}}: the same checkpoint as "small", quantized, under its own name)
    model_options: dict[str, dict] = field(default_factory=dict)
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    # more routed systems, each under its own policy over the same models (e.g. "speculative":
    # Speculative(k="auto") beside RStitch's "routed"); name them in `systems` to run them
    other_policies: dict[str, Policy] = field(default_factory=dict)
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    repeats: int = 3  # interleaved rounds; the tables show medians
    requests: int | None = None  # sessions per level; None: max(min_requests, C)
    min_requests: int = 8  # fewer, and one slow request is the level's throughput
    kv_cache_tokens: int | None = None  # per model; None: every session of the largest level at once, >= 8192
    threads: int | None = None  # torch threads per worker (routed, standard); None: turns on the CPU
    threads_lockstep: int | None = None  # torch threads of lockstep's one stepping thread; None: every core
    max_run_s: float | None = None
    reuse_engines: bool = False
    # "rounds": within a round, each system runs every level before the next system starts (a system's
    # engine is loaded once); "levels": each level runs every system before the next level (with
    # reuse_engines every system's engine stays loaded), so a run cut short loses levels, not baselines
    order: str = "rounds"
    seed: int = 0
    device: str = "cpu"
    dtype: str = "auto"
    cuda_graph_max_batch: int | None = None  # None: ModelSpec's default; 0: every GPU step eager
    warmup_tokens: int = 8

    def sessions(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(self.min_requests, concurrency)

    def check(self) -> None:
        clash = sorted(set(self.other_policies) & set(SYSTEMS))
        if clash:
            raise ConfigError(f"other_policies: {clash[0]!r} is a built-in system's name")
        unknown = [s for s in self.systems if s not in SYSTEMS and s not in self.other_policies]
        if unknown:
            names = ", ".join([*SYSTEMS, *self.other_policies])
            raise ConfigError(f"systems: unknown {unknown[0]!r}; expected some of {names}")
        if not self.systems or not self.workloads or not self.concurrency:
            raise ConfigError("give at least one system, one workload and one concurrency level")
        for name in (
            "repeats",
            "threads",
            "threads_lockstep",
            "warmup_tokens",
            "requests",
            "min_requests",
            "kv_cache_tokens",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}: must be an integer >= 1, got {value!r}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ConfigError(f"concurrency: every level must be an integer >= 1, got {self.concurrency}")
        if self.order not in ("rounds", "levels"):
            raise ConfigError(f"order: 'rounds' or 'levels', got {self.order!r}")
        if self.max_run_s is not None and not 0 < self.max_run_s < float("inf"):
            raise ConfigError(f"max_run_s: must be a positive number of seconds, got {self.max_run_s!r}")
        for name, policy in {"policy": self.policy, **self.other_policies}.items():
            missing = [m for m in policy.models if m not in self.models]
            if missing:
                raise ConfigError(f"models: {name} names {missing}, which are not given")
        unknown = sorted(set(self.model_options) - set(self.models))
        if unknown:
            raise ConfigError(f"model_options: {unknown[0]!r} is not one of the models ({', '.join(self.models)})")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ConfigError(f"workloads: each may be given once, got {names}")
