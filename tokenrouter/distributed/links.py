"""A worker's side of its peers in other processes, and of the caller's side of an actor.

`PeerLink` stands where `WorkerThread.peers` holds a peer: `hand_off` and `release` buffer
what a delivery sends, and `flush` (once per delivery, `LinkedWorker.deliver`) sends it as one
envelope, on the peer's direct channel (`channel.py`), else as a Ray call; neither waits for
the peer. `CallerLink` is the engine's own line to an actor
(submissions, aborts, stop), sent as it comes from any thread. Both number their envelopes
(`in_order.py`). A link whose peer was lost refuses hand-offs, so the sending worker ends those
requests itself, as it does when an in-process peer has stopped.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from ..engine import Request
from ..policies import PeerMessage
from . import wire
from .channel import Channel


class CallerLink:
    """Envelopes to one actor from one sender, each sent as soon as it is posted (any thread):
    on the direct `channel` when there is one that works, else as a Ray call."""

    def __init__(self, handle, sender: str, channel: Channel | None = None):
        self.handle = handle
        self.sender = sender
        self.channel = channel
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def send(self, items: list) -> None:
        with self._lock:  # numbered and sent in one order
            data = wire.dumps(wire.Envelope(self.sender, next(self._seq), items))
            if self.channel is None or not self.channel.send(data):
                self.handle.post.remote(data)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


class PeerLink:
    """A peer worker in a Ray actor, as the stepping thread of a `LinkedWorker` sees it.

    `leave(request_id)` gives (the number of the request's next event, its incarnation) when it
    leaves: the receiver numbers its events from there."""

    def __init__(
        self, name: str, handle, sender: str, leave: Callable[[str], tuple[int, int]], channel: Channel | None = None
    ):
        self.name = name
        self.link = CallerLink(handle, sender, channel)
        self.leave = leave
        self.error: str | None = None  # set when the peer's actor is lost
        self._items: list = []

    def hand_off(self, msg: PeerMessage, req: Request) -> bool:
        if self.error is not None:
            return False
        event_seq, inc = self.leave(req.request_id)
        self._items.append(wire.ForIncarnation(wire.HandOff(msg, req), inc, event_seq))
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
