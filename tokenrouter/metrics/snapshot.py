"""What `Engine.metrics()` returns: plain data, cheap to take, for dashboards and tests.

Counters and histograms are of requests that have ended, counted on the caller's side since the
engine was constructed (they survive close and restart, so Prometheus sees them only grow). The
per-model numbers are the running workers' own, read when the snapshot is taken."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..engine import WorkerStats

INF = math.inf
# Upper bounds in seconds, fixed so that histograms from different runs and engines add up.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, INF)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, INF)


@dataclass(frozen=True)
class Histogram:
    """Observations by bucket: `counts[i]` fell in (bounds[i-1], bounds[i]]; the last bound is inf."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def cumulative(self) -> list[int]:
        """Observations <= each bound (Prometheus' `le` buckets)."""
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


@dataclass(frozen=True)
class ModelMetrics:
    """One running worker: its KV pool and the requests it holds."""

    kv_blocks_in_use: int
    kv_blocks_total: int
    waiting: int  # admitted to the worker, not yet scheduled
    running: int  # in its batch
    pending: int  # parked here, KV kept, while a peer writes

    @classmethod
    def from_stats(cls, s: WorkerStats) -> ModelMetrics:
        return cls(s.kv_blocks_total - s.kv_blocks_free, s.kv_blocks_total, s.waiting, s.running, s.pending)


@dataclass(frozen=True)
class EngineMetrics:
    requests: dict[str, int]  # ended requests by finish reason: stop, length, abort, error
    time_to_first_token: Histogram  # seconds from submission, requests that got a token
    latency: Histogram  # seconds from submission to the end, every ended request
    tokens_generated: dict[str, int]  # tokens of ended requests, by the model that wrote them
    handoffs: int  # hand-offs of ended requests
    models: dict[str, ModelMetrics]  # per running worker; empty while the engine is closed
