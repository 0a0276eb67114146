"""What crosses between processes when workers live in Ray actors: plain dataclasses.

Everything a worker receives travels in an `Envelope`, one per sender per delivery (a step's
hand-offs and releases to one peer go together), numbered per sender so that the receiver
applies them in the order they were sent whatever order the transport keeps. Everything a worker
sends its caller (the engine) travels in one `EventBatch` per `take`: the events of the steps
since the last one, each numbered per request (`NumberedEvent`), so that the engine can put the
events of a request that moved between workers back in the order they were written; hand-offs
to a worker in the caller's own process; and the answers to a census after a peer was lost.

A request is known by its id and its incarnation (`inc`): the engine numbers each submission, so
that an abort of one request can never end a later one that reuses its id.

Envelopes and batches cross as bytes from `dumps` (the standard pickle; cloudpickle only for
what it cannot take): Ray's own serializer, made for arbitrary objects, took ~1 ms for an
envelope of 16 hand-offs that pickle writes in 0.1 ms (docs/distributed.md has the numbers).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

from ..engine import Abort, HandOff, Release, Stop, Submit, WorkerEvent, WorkerStats


@dataclass(frozen=True)
class ForIncarnation:
    """An inbox message (`Submit`, `HandOff` or `Abort`, as in one process) for one incarnation
    of its request; a hand-off also carries the number its request's next event takes (the events
    it had so far, on every worker). An abort ends that incarnation wherever it is, and one that
    arrives before its request ends it on arrival."""

    item: Submit | HandOff | Abort
    inc: int
    event_seq: int = 0


@dataclass(frozen=True)
class PeerLost:
    """A peer's actor is gone: refuse hand-offs to it from now on, and report the requests this
    worker owns (the census that finds requests lost with the peer)."""

    name: str
    error: str


@dataclass(frozen=True)
class Echo:
    """Measuring the transport, like ICMP's echo: one that names `reply_to` goes back without it
    on the line to that peer; one without it is the answer."""

    token: int
    reply_to: str | None = None


Item = ForIncarnation | Release | Stop | PeerLost | Echo


@dataclass(frozen=True)
class Envelope:
    sender: str  # unique per sending side (an engine, or a peer worker)
    seq: int  # 1, 2, ... per sender
    items: list


@dataclass(frozen=True)
class NumberedEvent:
    event: WorkerEvent
    n: int  # the event's place among its request's events, counted over every worker


@dataclass(frozen=True)
class ToCaller:
    """A hand-off (or a release) for a worker in the caller's process."""

    target: str
    handoff: ForIncarnation | None = None  # of a HandOff
    release: str | None = None


@dataclass(frozen=True)
class Census:
    """After `lost` went: the requests this worker owns (running or waiting, not pending)."""

    lost: str
    owned: list[str]


@dataclass
class EventBatch:
    source: str = ""  # the worker it comes from
    events: list[NumberedEvent] = field(default_factory=list)
    to_caller: list[ToCaller] = field(default_factory=list)
    census: list[Census] = field(default_factory=list)
    alive: bool = True  # the worker's stepping thread runs
    error: str | None = None  # why it died
    stopped: bool = False  # it has stopped and everything it had is in this batch
    stats: WorkerStats | None = None  # its last statistics, with `stopped`


@dataclass(frozen=True)
class LoadFailure:
    """Loading failed on the actor's node: the error's kind and message, raised again by the caller."""

    kind: str  # "ConfigError" or "ModelLoadError"
    message: str


def dumps(obj) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):  # e.g. a policy field holding a lambda
        from ray import cloudpickle

        return cloudpickle.dumps(obj, protocol=5)


def loads(data: bytes):
    return pickle.loads(data)
