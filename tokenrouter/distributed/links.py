"""A worker's side of its peers in other processes, and of the caller's side of an actor.

`PeerLink` stands where `WorkerThread.peers` holds a peer: `hand_off` and `release` buffer
what a delivery sends, and `flush` (once per delivery, `LinkedWorker.deliver`) sends it as one
envelope, a Ray call that returns at once. `CallerLink` is the engine's own line to an actor
(submissions, aborts, stop), sent as it comes from any thread. Both number their envelopes
(`in_order.py`). A link whose peer was lost refuses hand-offs, so the sending worker ends those
requests itself, as it does when an in-process peer has stopped.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from ..engine.sequence import Request
from ..policies.base import PeerMessage
from . import wire


class CallerLink:
    """Envelopes to one actor from one sender, each sent as soon as it is posted (any thread)."""

    def __init__(self, handle, sender: str):
        self.handle = handle
        self.sender = sender
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def send(self, items: list) -> None:
        with self._lock:  # numbered and handed to Ray in one order
            self.handle.post.remote(wire.dumps(wire.Envelope(self.sender, next(self._seq), items)))


class PeerLink:
    """A peer worker in a Ray actor, as the stepping thread of a `LinkedWorker` sees it.

    `leave(request_id)` gives (the number of the request's next event, its incarnation) when it
    leaves: the receiver numbers its events from there."""

    def __init__(self, name: str, handle, sender: str, leave: Callable[[str], tuple[int, int]]):
        self.name = name
        self.link = CallerLink(handle, sender)
        self.leave = leave
        self.error: str | None = None  # set when the peer's actor is lost
        self._items: list = []

    def hand_off(self, msg: PeerMessage, req: Request) -> bool:
        if self.error is not None:
            return False
        event_seq, inc = self.leave(req.request_id)
        self._items.append(wire.HandOff(msg, req, event_seq, inc))
        return True

    def release(self, request_id: str) -> None:
        if self.error is None:
            self._items.append(wire.Release(request_id))

    def flush(self) -> None:
        """Send what this delivery buffered, as one envelope (a Ray call that returns at once)."""
        if self._items:
            items, self._items = self._items, []
            if self.error is None:
                self.link.send(items)

    def lost(self, error: str) -> None:
        self.error = error
