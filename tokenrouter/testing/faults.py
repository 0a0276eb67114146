"""Faults injected into one model of a running engine, for tests of how the engine (or the code
around it) copes: a forward that fails, one that is slow or never returns, a scheduler bug that
kills the worker's loop.

Each takes the engine and a model's name (its worker is the one the engine lends, engine_parts.py),
and holds from that model's next step until the engine closes (started again, the engine has new
workers, whole).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..engine import ForwardOutput, ScheduledBatch, WorkerThread
from .engine_parts import workers_of

Forward = Callable[[ScheduledBatch], ForwardOutput]


def wrap_forward(engine: Any, model: str, wrap: Callable[[Forward, ScheduledBatch], ForwardOutput]) -> None:
    """Every later forward of `model` runs as `wrap(forward, batch)` in its worker's thread, where
    `forward(batch)` is the real one: to watch a step, hold it, or fail it (an exception fails the
    step's batch). The model must run in this process."""
    runner = _in_process(engine, model).core.runner
    forward = runner.forward
    runner.forward = partial(wrap, forward)


def fail_forward(
    engine: Any, model: str, error: Exception, when: Callable[[list[str]], bool] = lambda request_ids: True
) -> list[list[str]]:
    """The first forward of `model` whose batch `when(request_ids)` accepts raises `error`: that
    step fails, and every request in its batch ends with finish_reason 'error'; the worker goes
    on. Returns a list that gets that batch's request ids once it has failed."""
    failed: list[list[str]] = []

    def forward_or_fail(forward: Forward, batch: ScheduledBatch) -> ForwardOutput:
        ids = [seq.request_id for seq in batch.seqs]
        if not failed and when(ids):
            failed.append(ids)
            raise error
        return forward(batch)

    wrap_forward(engine, model, forward_or_fail)
    return failed


def break_scheduler(engine: Any, model: str, error: Exception) -> None:
    """The first time `model`'s worker holds a request, its scheduler raises `error`: the worker's
    loop dies, as on a bug in it (a failed forward only fails its batch). Its requests fail with
    the error, and `health()` names it. The model may run in a Ray actor."""
    worker = workers_of(engine)[model]
    if isinstance(worker, WorkerThread):
        _break_scheduler_of(worker, error)
    else:  # a RemoteWorker: broken in its actor
        worker.inspect(partial(_break_scheduler_of, error=error))


def _break_scheduler_of(worker: WorkerThread, error: Exception) -> None:
    """`break_scheduler` on the worker itself (in its actor, for one in a Ray actor)."""
    scheduler = worker.core.scheduler
    schedule = scheduler.schedule

    def schedule_or_fail():
        if worker.core.seqs:
            raise error
        return schedule()

    scheduler.schedule = schedule_or_fail


def _in_process(engine: Any, model: str) -> WorkerThread:
    worker = workers_of(engine)[model]
    if not isinstance(worker, WorkerThread):
        raise TypeError(f"model {model!r} runs in a Ray actor; this fault needs a model in this process")
    return worker
