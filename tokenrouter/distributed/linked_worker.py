"""A `WorkerThread` whose peers may be in other processes.

It is the worker inside each Ray actor, and the worker of a model that stays in the caller's
process while another is placed in an actor. Its peers in other processes are `PeerLink`s
(`links.py`): a step's hand-offs and releases to each are buffered while the step is delivered
and sent together at its end, one Ray call per peer per step; `after_delivery` then runs (the
actor makes the step's events available to the engine's next `take`). The time this costs the
stepping thread is counted in `stats().time_transport_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..engine import Outbox, SeqStatus, WorkerStats, WorkerThread


class LinkedWorker(WorkerThread):
    def __init__(self, *args, after_delivery: Callable[[], None] | None = None, **kw):
        super().__init__(*args, **kw)
        self.links: list = []  # the peers whose messages are buffered per delivery
        self.after_delivery = after_delivery
        self.time_transport = 0.0
        self.peer_rtt_s: dict[str, float] = {}  # round trips to peers in other processes, measured at start

    def connect_peers(self, peers: dict) -> None:
        """`peers`: name -> an in-process worker, a `PeerLink`, or anything with `hand_off`,
        `release`, `error` and `flush` (the actor's line to a worker in its caller's process)."""
        self.peers = {name: p for name, p in peers.items() if p is not self}
        self.links = [p for p in self.peers.values() if hasattr(p, "flush")]

    def deliver(self, out: Outbox) -> None:
        super().deliver(out)
        t0 = time.perf_counter()
        for link in self.links:
            link.flush()
        if self.after_delivery is not None:
            self.after_delivery()
        self.time_transport += time.perf_counter() - t0

    def stats(self) -> WorkerStats:
        s = super().stats()
        s.time_transport_s = self.time_transport
        return s


def owned_requests(core) -> list[str]:
    """The requests a core owns: running or waiting there, not pending at a peer (the census
    after a peer is lost, distributed/losses.py)."""
    return [rid for rid, seq in core.seqs.items() if seq.status is not SeqStatus.PENDING]
