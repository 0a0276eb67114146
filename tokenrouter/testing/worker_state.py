"""What one model's worker holds, read straight from its core: for tests that check the engine's
own reports (`stats()`, `metrics()`) against the truth, or that wait for or freeze a worker in a
chosen state (a predicate built on these).

`worker` is a worker in this process (`workers_of(engine)[model]`, engine_parts.py), or the one that
`RemoteWorker.inspect(fn)` hands `fn` in its Ray actor. Read from another thread than the
worker's own, a value a step is changing may be read half-changed: read while the worker is
frozen or idle, or from a predicate that runs between its steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..engine import HandOff, Sequence, WorkerThread


def live_sequences(worker: WorkerThread) -> Mapping[str, Sequence]:
    """Every request the worker holds, by id: waiting, running, or parked with its KV kept while a
    peer writes. A read-only view of the worker's own mapping: it changes as the worker steps."""
    return MappingProxyType(worker.core.seqs)


def scheduler_queues(worker: WorkerThread) -> tuple[int, int]:
    """(running, waiting): requests the scheduler steps, and requests admitted but not yet started."""
    scheduler = worker.core.scheduler
    return len(scheduler.running), len(scheduler.waiting)


def kv_blocks_in_use(worker: WorkerThread) -> int:
    """KV blocks some request holds now (a cached prefix nobody holds counts as free); 0 when idle."""
    blocks = worker.core.blocks
    return blocks.num_blocks - blocks.num_free


def kv_blocks_total(worker: WorkerThread) -> int:
    """The blocks of the worker's KV pool."""
    return worker.core.blocks.num_blocks


def handoff_waiting(worker: WorkerThread, request_id: str) -> bool:
    """Whether a hand-off of the request has been posted to the worker and not yet taken from its
    inbox: the moment between one model sending a request and the next one receiving it."""
    return any(isinstance(m, HandOff) and m.req.request_id == request_id for m in worker.inbox.snapshot())


def captures_hidden_states(worker: WorkerThread) -> bool:
    """Whether the worker's forwards keep the last hidden states, for a policy that routes on them
    (`requires` holds HIDDEN); a policy that does not ask costs no capture."""
    return worker.core.runner.capture is not None
