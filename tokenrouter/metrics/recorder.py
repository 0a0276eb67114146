"""The caller-side counters behind `Engine.metrics()`: one `record` per request end.

Several event loops and threads may use one engine at once, so every update and snapshot
holds one lock; a record is a few dict and list updates, never a wait."""

from __future__ import annotations

import bisect
import threading

from ..outputs import RequestOutput
from .snapshot import LATENCY_BUCKETS, TTFT_BUCKETS, EngineMetrics, Histogram, ModelMetrics

FINISH_REASONS = ("stop", "length", "abort", "error")


class _Buckets:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, x)] += 1  # x <= bound, as Prometheus' le
        self.sum += x
        self.count += 1

    def snapshot(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.sum, self.count)


class RequestMetrics:
    def __init__(self, models: list[str]):
        self._lock = threading.Lock()
        self._requests = dict.fromkeys(FINISH_REASONS, 0)
        self._tokens = dict.fromkeys(models, 0)  # every model present, so label sets never change
        self._handoffs = 0
        self._ttft = _Buckets(TTFT_BUCKETS)
        self._latency = _Buckets(LATENCY_BUCKETS)

    def record(self, out: RequestOutput) -> None:
        """A request has ended (finished, failed, aborted or cancelled): count it once."""
        with self._lock:
            self._requests[out.finish_reason] = self._requests.get(out.finish_reason, 0) + 1
            for model, n in out.tokens_per_model().items():
                self._tokens[model] = self._tokens.get(model, 0) + n
            self._handoffs += out.num_handoffs
            if out.time_to_first_token is not None:
                self._ttft.observe(out.time_to_first_token)
            self._latency.observe(out.latency)

    def snapshot(self, models: dict[str, ModelMetrics]) -> EngineMetrics:
        with self._lock:
            return EngineMetrics(
                requests=dict(self._requests),
                time_to_first_token=self._ttft.snapshot(),
                latency=self._latency.snapshot(),
                tokens_generated=dict(self._tokens),
                handoffs=self._handoffs,
                models=models,
            )
