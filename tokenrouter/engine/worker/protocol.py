"""What the engine uses of a worker, whichever side of a process boundary it is on.

A `WorkerThread` steps its core in this process; a `RemoteWorker` (distributed/) is the caller's
handle on one in a Ray actor. Both satisfy `Worker`, and the engine, the throughput model's
controller and the fleet see nothing else of them. The switch between the two is made once, in
`api/launch.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from ..outbox import WorkerEvent
from ..sequence import Request
from .stats import WorkerStats

Sink = Callable[[list[WorkerEvent]], None]  # where a worker delivers each step's events


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs its loop; fixed for its life but B, which the throughput model moves."""

    batch_min: int = 1  # B at start: hold off stepping until this many requests are ready (delayed batching)
    batch_wait_s: float = 0.0  # most a hold lasts
    num_threads: int | None = None  # torch intra-op threads of the stepping thread (None: its turn's, or all)


class Worker(Protocol):
    name: str
    error: str | None  # why it died, once it has
    batch_min: int  # B in force
    host: str | None  # the machine it computes on (workers on several share nothing)
    handoff_delay_s: float  # seconds a hand-off takes to reach a peer (0 within one process)

    # set-up and shut-down
    def start(self) -> None: ...
    def wait_ready(self) -> Any: ...  # its LoadedModel (or the facts of one, from an actor)
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> bool: ...

    # requests
    def submit(self, req: Request) -> bool: ...
    def abort(self, request_id: str) -> None: ...
    def release(self, request_id: str) -> None: ...
    def hand_off(self, msg, req: Request) -> bool: ...

    # between steps
    def set_batch_min(self, b: int) -> None: ...
    def call(self, fn: Callable[[Any], Any]) -> Future: ...
    def reset_prefix_cache(self) -> Future: ...

    # reports
    @property
    def alive(self) -> bool: ...
    @property
    def takes_turns(self) -> bool: ...  # its steps take turns on the CPU cores with the other workers' (cpu_turns.py)
    @property
    def capacity_tokens(self) -> int: ...
    @property
    def torch_threads(self) -> int | None: ...
    def stats(self) -> WorkerStats: ...
    def routing_counters(self) -> dict[str, float | dict[int, int]]: ...
