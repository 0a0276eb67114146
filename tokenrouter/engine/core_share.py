"""The CPU cores that an engine's workers step on, shared so that none sits idle.

On a GPU each worker's forward is queued on the device; on CPU every worker's forward runs on
the same cores, through torch's intra-op threads of the worker's own thread. A fixed split (one
thread per worker on two cores) leaves half the machine idle whenever one model has nothing to
do, which at one request in flight is always; all cores for every worker oversubscribes them
when both step, and OpenMP teams fighting over cores run far slower than either alone.

So a worker claims cores while it has work: before each step it takes every core no other
worker has claimed (at least one), and it gives them back when it runs out of ready requests.
A worker stepping alone gets all cores; two busy workers settle on half each within one step
(the one that claimed first keeps its cores until its current step ends).
"""

from __future__ import annotations

import os
import threading


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class CoreShare:
    def __init__(self, cores: int, workers: int):
        self.cores = max(1, cores)
        self.workers = max(1, workers)
        self._lock = threading.Lock()
        self._claims: dict[str, int] = {}

    @property
    def fair_share(self) -> int:
        """Threads a worker gets when every worker is busy (what its latency profile measures)."""
        return max(1, self.cores // self.workers)

    def claim(self, worker: str) -> int:
        """The threads `worker` should step with now; it holds them until `release`."""
        with self._lock:
            others = sum(n for name, n in self._claims.items() if name != worker)
            threads = max(1, self.cores - others)
            self._claims[worker] = threads
            return threads

    def release(self, worker: str) -> None:
        with self._lock:
            self._claims.pop(worker, None)

    def claims(self) -> dict[str, int]:
        with self._lock:
            return dict(self._claims)
