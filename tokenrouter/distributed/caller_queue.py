"""What an actor's worker sends its caller: one batch a step, with the step's events, each
numbered per request, and the hand-offs and releases for workers in the caller's process.

`Tracks` numbers a request's events from the number it brought when it arrived
(`wire.NumberedEvent`), so that the caller puts them back in order whichever worker wrote them.
`CallerQueue` stages what a delivery makes and sends it at its end, on the direct channel to
the caller (`channel.py`) when there is one that works, else keeps it for the caller's next
`take` (the Ray call the caller keeps open, which is also how it learns that the actor died).
`CallerPeer` is a peer in the caller's process: what the worker hands it goes in that batch.
"""

from __future__ import annotations

import logging
import threading
import time

from ..engine import Request, WorkerEvent
from . import wire
from .channel import Channel

log = logging.getLogger(__name__)


class Tracks:
    """Per request here: the number of its next event and its incarnation. Set when it arrives,
    read when it leaves, dropped when it ends."""

    def __init__(self):
        self._tracks: dict[str, list[int]] = {}  # request id -> [next event number, incarnation]
        self._lock = threading.Lock()

    def arrive(self, request_id: str, n: int, inc: int) -> None:
        with self._lock:
            self._tracks[request_id] = [n, inc]

    def number(self, events: list[WorkerEvent]) -> list[wire.NumberedEvent]:
        out = []
        with self._lock:
            for ev in events:
                track = self._tracks.get(ev.request_id)
                if track is None:
                    log.warning("an event of request %s, which never arrived here", ev.request_id)
                    track = self._tracks[ev.request_id] = [0, -1]
                out.append(wire.NumberedEvent(ev, track[0]))
                track[0] += 1
                if ev.finish_reason is not None:
                    del self._tracks[ev.request_id]
        return out

    def leave(self, request_id: str) -> tuple[int, int]:
        with self._lock:
            track = self._tracks.pop(request_id, None)
        return (track[0], track[1]) if track is not None else (0, -1)

    def incarnation(self, request_id: str) -> int:
        with self._lock:
            track = self._tracks.get(request_id)
        return track[1] if track is not None else -1


class CallerQueue:
    """What goes to the engine: staged during a delivery and sent at its end, one batch a step,
    on the direct channel to the caller (`channel.py`) when there is one that works; else kept
    for the caller's next `take`, a Ray call."""

    def __init__(self, source: str):
        self.source = source
        self.channel: Channel | None = None
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()  # batches leave in the order they were made
        self._staged = wire.EventBatch(source=source)
        self._ready = wire.EventBatch(source=source)
        self._closed = False  # the worker has stopped
        self._final_sent = False  # ... and its last batch went on the channel
        self._down = False  # it no longer steps: every batch says so, with `_down_error`
        self._down_error: str | None = None

    def stage_events(self, events: list[wire.NumberedEvent]) -> None:
        with self._cond:
            self._staged.events.extend(events)

    def stage_to_caller(self, item: wire.ToCaller) -> None:
        with self._cond:
            self._staged.to_caller.append(item)

    def add_census(self, census: wire.Census) -> None:
        with self._cond:
            self._staged.census.append(census)
        self.publish()

    def mark_down(self, error: str | None) -> None:
        """The worker no longer steps (it died, or it is stopping): every batch from now on says
        so. A request refused then ends with the worker's error, and the caller must know the
        worker is down before it sees that end, not only with the last batch."""
        with self._cond:
            self._down, self._down_error = True, error

    def publish(self, final: wire.EventBatch | None = None) -> None:
        """Send what is staged (and `final`'s flags with it, once the worker has stopped)."""
        with self._send_lock:
            with self._cond:
                staged, self._staged = self._staged, wire.EventBatch(source=self.source)
                for name in ("events", "to_caller", "census"):
                    getattr(self._ready, name).extend(getattr(staged, name))
                empty = not (self._ready.events or self._ready.to_caller or self._ready.census)
                if empty and final is None:
                    return
                if self.channel is not None and self.channel.usable:
                    batch, self._ready = self._ready, wire.EventBatch(source=self.source)
                    if self._down:
                        batch.alive, batch.error = False, self._down_error
                else:
                    batch = None
            if batch is not None:
                if final is not None:
                    batch.alive, batch.error, batch.stopped, batch.stats = final.alive, final.error, True, final.stats
                if self.channel.send(wire.dumps(batch)):
                    if final is not None:
                        self._final_sent = True
                    return
                with self._cond:  # the channel broke: the caller's next take gets it
                    for name in ("events", "to_caller", "census"):
                        getattr(batch, name).extend(getattr(self._ready, name))
                    self._ready = batch
                    batch.stopped, batch.stats = False, None
            with self._cond:
                self._cond.notify_all()

    def close(self, final: wire.EventBatch) -> None:
        """The worker has stopped: its last batch says so (on the channel, or to the next take)."""
        self.publish(final)
        with self._cond:
            self._closed = True
            self._final = final
            self._cond.notify_all()

    def take(self, wait_s: float) -> wire.EventBatch:
        """What the channel could not carry (waiting up to `wait_s` for something); flagged
        stopped, with the last statistics, once the worker has stopped and the channel did not
        carry that."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._closed and not (self._ready.events or self._ready.to_caller or self._ready.census):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            out, self._ready = self._ready, wire.EventBatch(source=self.source)
            if self._closed and not self._final_sent:
                out.alive, out.error, out.stopped, out.stats = (
                    self._final.alive,
                    self._final.error,
                    True,
                    self._final.stats,
                )
            return out


class CallerPeer:
    """A peer in the actor's caller's process: what this worker sends it goes with its events."""

    def __init__(self, name: str, tracks: Tracks, queue: CallerQueue):
        self.name = name
        self.tracks = tracks
        self.queue = queue
        self.error: str | None = None

    def hand_off(self, msg, req: Request) -> bool:
        event_seq, inc = self.tracks.leave(req.request_id)
        self.queue.stage_to_caller(
            wire.ToCaller(self.name, handoff=wire.ForIncarnation(wire.HandOff(msg, req), inc, event_seq))
        )
        return True

    def release(self, request_id: str) -> None:
        self.queue.stage_to_caller(wire.ToCaller(self.name, release=request_id))

    def flush(self) -> None:
        """Nothing to send apart: it goes with the events, when the delivery publishes them."""
