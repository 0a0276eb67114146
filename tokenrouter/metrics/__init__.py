"""Engine metrics: the snapshot `Engine.metrics()` returns, and a Prometheus collector over it."""

from .prometheus import PrometheusCollector
from .recorder import RequestMetrics
from .snapshot import LATENCY_BUCKETS, TTFT_BUCKETS, EngineMetrics, Histogram, ModelMetrics

__all__ = ["EngineMetrics", "Histogram", "LATENCY_BUCKETS", "ModelMetrics", "PrometheusCollector", "TTFT_BUCKETS"]
__all__ += ["RequestMetrics"]
