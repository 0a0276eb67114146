"""The scheduler (continuous batching, chunked prefill, eviction, preemption) and the batch it
hands the runner."""

from .batch import ScheduledBatch
from .scheduler import PoolTooSmall, Scheduler, SchedulerStats

__all__ = ["PoolTooSmall", "ScheduledBatch", "Scheduler", "SchedulerStats"]
