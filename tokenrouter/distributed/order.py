"""Every request's events delivered to the engine in the order they were written, and a request
ended here when what it waits on is gone.

Each worker numbers the events it writes for a request, continuing from the number the request
brought when it arrived (`wire.NumberedEvent`), so the fleet delivers every request's events to
the engine in the order they were written, whichever actor's poll brings them first; it follows
each request's owner from the events' `handoff_to`. A request handed to a lost worker, or refused
by a worker in this process, ends here (`fail`): the engine gets its last event, with the
error, and the surviving workers free their copies of it.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from ..engine import Request, Sink, WorkerEvent
from . import wire
from .linked_worker import LinkedWorker
from .remote_worker import RemoteWorker


@dataclass
class Track:
    """A request the fleet follows: where it is and which of its events comes next."""

    req: Request
    inc: int
    owner: str
    expected: int = 0  # the number of the next event to deliver
    held: dict[int, WorkerEvent] = field(default_factory=dict)  # events that came before their turn
    local_next: int | None = None  # the number of the next event a worker in this process writes


@dataclass
class Roster:
    """The fleet's workers: in this process, in actors, all of them (in the specs' order), and
    those lost (name -> the error that names it)."""

    local: dict[str, LinkedWorker] = field(default_factory=dict)
    remote: dict[str, RemoteWorker] = field(default_factory=dict)
    workers: dict[str, LinkedWorker | RemoteWorker] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)


class RequestOrder:
    """The requests the fleet follows; `sink` (the engine's) gets each one's events in turn."""

    def __init__(self, roster: Roster, sink: Sink):
        self.roster = roster
        self.sink = sink
        self.tracks: dict[str, Track] = {}
        self.lock = threading.RLock()  # the fleet's one lock: the loss handling (losses.py) takes it too
        self._incs = itertools.count(1)

    def follow(self, req: Request, entry: str) -> None:
        """The engine submits a request to model `entry`: follow it from here, a new incarnation."""
        with self.lock:
            self.tracks[req.request_id] = Track(
                req, next(self._incs), entry, local_next=0 if entry in self.roster.local else None
            )

    def incarnation(self, request_id: str) -> int:
        with self.lock:
            track = self.tracks.get(request_id)
            return track.inc if track is not None else -1

    def leave(self, request_id: str) -> tuple[int, int]:
        """A request leaves this process for an actor: (its next event's number, its incarnation)."""
        with self.lock:
            track = self.tracks.get(request_id)
            if track is None:
                return 0, -1
            n = max(track.local_next or 0, track.expected)
            track.local_next = None
            return n, track.inc

    def local_sink(self, events: list[WorkerEvent]) -> None:
        """A worker in this process delivers a step's events: numbered, then in order."""
        with self.lock:
            out = []
            for ev in events:
                track = self.tracks.get(ev.request_id)
                if track is None:
                    continue
                n = track.local_next if track.local_next is not None else track.expected
                track.local_next = n + 1
                self.add(track, n, ev, out)
            self.deliver(out)

    def remote_events(self, events: list[wire.NumberedEvent]) -> None:
        """Events from an actor, numbered there."""
        with self.lock:
            out = []
            for ne in events:
                track = self.tracks.get(ne.event.request_id)
                if track is not None:
                    self.add(track, ne.n, ne.event, out)
            self.deliver(out)

    def add(self, track: Track, n: int, ev: WorkerEvent, out: list) -> None:
        """Hold event n of a request until its turn; deliver what is now in order."""
        if n < track.expected:
            return  # seen before
        track.held[n] = ev
        while track.expected in track.held:
            ev = track.held.pop(track.expected)
            track.expected += 1
            out.append(ev)
            if ev.finish_reason is not None:
                self.tracks.pop(ev.request_id, None)
                return
            if ev.handoff_to is not None:
                track.owner = ev.handoff_to
                if ev.handoff_to in self.roster.lost:
                    self.fail(track, self.roster.workers[ev.handoff_to].error, out)
                    return

    def deliver(self, out: list[WorkerEvent]) -> None:
        if out:
            self.sink(out)

    def to_local(self, item: wire.ToCaller) -> None:
        """A hand-off or release from an actor for a worker in this process."""
        worker = self.roster.local[item.target]
        with self.lock:
            if item.release is not None:
                worker.release(item.release)
                return
            h = item.handoff.item
            track = self.tracks.get(h.req.request_id)
            if track is None:  # ended meanwhile (aborted, or failed with a lost worker)
                return
            track.local_next = max(item.handoff.event_seq, track.local_next or 0)
            if not worker.hand_off(h.msg, track.req):  # the caller's own Request: its aborted flag is shared
                out: list[WorkerEvent] = []
                self.fail(
                    track,
                    worker.error or f"worker {item.target!r} is not running",
                    out,
                    "error" if worker.error else "abort",
                )
                self.deliver(out)

    def fail(self, track: Track, error: str | None, out: list, reason: str = "error") -> None:
        """End a request here with an error; the surviving workers free their copies of it (those
        in actors their copies of this incarnation only)."""
        rid = track.req.request_id
        self.tracks.pop(rid, None)
        out.append(WorkerEvent(rid, [], track.owner, finish_reason=reason, error=error))
        track.req.aborted = True
        for name, worker in self.roster.workers.items():
            if name in self.roster.lost:
                continue
            if name in self.roster.remote:
                worker.abort_incarnation(rid, track.inc)
            else:
                worker.abort(rid)
