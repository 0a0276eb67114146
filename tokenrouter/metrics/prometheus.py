"""A Prometheus collector that reads `engine.metrics()` when scraped: no thread, no copies of the
counters. `prometheus_client` is imported only when a collector is made (the `metrics` extra).

>>> from prometheus_client import CollectorRegistry, generate_latest
>>> registry = CollectorRegistry()
>>> registry.register(PrometheusCollector(engine))
>>> generate_latest(registry)

The metric names, types and labels are listed in docs/sdk.md."""

from __future__ import annotations

from collections.abc import Iterator

from .snapshot import EngineMetrics, Histogram

PREFIX = "tokenrouter_"


class PrometheusCollector:
    """Exposes one engine's metrics; `source` is anything with a `metrics()` returning
    `EngineMetrics` (an `Engine`, or an `LLM`)."""

    def __init__(self, source, prefix: str = PREFIX):
        try:
            import prometheus_client  # noqa: F401
        except ImportError as e:
            raise ImportError("PrometheusCollector needs prometheus_client: pip install 'tokenrouter[metrics]'") from e
        self.source = source
        self.prefix = prefix

    def describe(self) -> Iterator:
        """The metric families without samples, so the registry knows the names at `register`
        without scraping the engine."""
        return self._families(None)

    def collect(self) -> Iterator:
        return self._families(self.source.metrics())

    def _families(self, m: EngineMetrics | None) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p = self.prefix
        requests = CounterMetricFamily(p + "requests", "Requests ended, by finish reason.", labels=["finish_reason"])
        tokens = CounterMetricFamily(
            p + "generated_tokens", "Tokens of ended requests, by the model that wrote them.", labels=["model"]
        )
        handoffs = CounterMetricFamily(p + "handoffs", "Hand-offs between models of ended requests.")
        in_use = GaugeMetricFamily(p + "kv_blocks_in_use", "KV cache blocks held, per model.", labels=["model"])
        capacity = GaugeMetricFamily(
            p + "kv_blocks_capacity", "KV cache blocks in the pool, per model.", labels=["model"]
        )
        held = GaugeMetricFamily(
            p + "worker_requests", "Requests a model's worker holds, by state.", labels=["model", "state"]
        )
        if m is not None:
            for reason, n in m.requests.items():
                requests.add_metric([reason], n)
            for model, n in m.tokens_generated.items():
                tokens.add_metric([model], n)
            handoffs.add_metric([], m.handoffs)
            for model, w in m.models.items():
                in_use.add_metric([model], w.kv_blocks_in_use)
                capacity.add_metric([model], w.kv_blocks_total)
                for state in ("waiting", "running", "pending"):
                    held.add_metric([model, state], getattr(w, state))
        yield requests
        ttft, latency = (None, None) if m is None else (m.time_to_first_token, m.latency)
        yield _histogram(p + "time_to_first_token_seconds", "Seconds from submission to the first token.", ttft)
        yield _histogram(p + "request_latency_seconds", "Seconds from submission to the end of a request.", latency)
        yield tokens
        yield handoffs
        yield in_use
        yield capacity
        yield held


def _histogram(name: str, doc: str, h: Histogram | None):
    from prometheus_client.core import HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    if h is None:
        return HistogramMetricFamily(name, doc)
    buckets = [(floatToGoString(b), c) for b, c in zip(h.bounds, h.cumulative())]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum)
