"""What happens when a worker of the fleet is lost: nothing goes on waiting on it.

An actor is lost when Ray says so (a poll fails with the actor dead), never because a reply is
slow; a worker whose stepping thread died is as good as lost to its peers. Then: its worker is
marked dead (`health()` names it); the requests it owned, or that are on their way to it, end
with an error naming it; and every surviving worker is told: it refuses hand-offs to the lost
one from then on, frees its pending copies of the failed requests, and reports what it owns (a
census). A request that no survivor owns once all have answered was lost in transit with the
actor, and fails too. With three or more models a request moving between two survivors at that
moment can be taken for lost and fail as well (docs/distributed.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..engine import WorkerEvent
from .linked_worker import owned_requests
from .links import PeerLink
from .order import RequestOrder

log = logging.getLogger(__name__)


@dataclass
class Census:
    """Who still has to answer after `lost` went, what they own, and which requests it covers."""

    waiting: set[str]
    upto: int  # incarnations submitted before it started
    owned: set[str] = field(default_factory=set)


class Losses:
    """The fleet's lost workers and the censuses that follow each loss, over `order`'s requests."""

    def __init__(self, order: RequestOrder):
        self.order = order
        self.roster = order.roster
        self.censuses: dict[str, Census] = {}  # lost worker -> its census, until every survivor answered
        self.closing = False  # the fleet is closing: an actor going away now is no loss

    def lost(self, name: str, error: str) -> None:
        """Worker `name` is gone: its actor was lost, or its stepping thread died (`error` says
        which, naming it)."""
        order, roster = self.order, self.roster
        with order.lock:
            if self.closing or name in roster.lost:
                return
            log.error("%s", error)
            roster.lost[name] = error
            roster.remote[name].mark_lost(error)
            for worker in roster.local.values():  # refuse hand-offs to it from now on
                peer = worker.peers.get(name)
                if isinstance(peer, PeerLink):
                    peer.lost(error)
            out: list[WorkerEvent] = []
            for track in [t for t in order.tracks.values() if t.owner == name]:
                order.fail(track, error, out)
            order.deliver(out)
            survivors = [n for n, w in roster.workers.items() if n not in roster.lost and w.alive]
            census = self.censuses[name] = Census(
                set(survivors), upto=max((t.inc for t in order.tracks.values()), default=0)
            )
            for n in survivors:
                worker = roster.workers[n]
                if n in roster.remote:  # its actor answers in a later batch (`census_reply`)
                    worker.peer_lost(name, error)
                else:
                    worker.call(owned_requests).add_done_callback(
                        lambda f, n=n: self.census_reply(name, n, f.result() if f.exception() is None else [])
                    )
            if not census.waiting:
                self._census_done(name)
            for other, c in list(self.censuses.items()):  # a census still waiting on it waits no more
                if name in c.waiting:
                    c.waiting.discard(name)
                    if not c.waiting:
                        self._census_done(other)

    def census_reply(self, lost: str, worker: str, owned: list[str]) -> None:
        """Worker `worker` owns `owned`, it says after `lost` went."""
        with self.order.lock:
            census = self.censuses.get(lost)
            if census is None or worker not in census.waiting:
                return
            census.waiting.discard(worker)
            census.owned.update(owned)
            if not census.waiting:
                self._census_done(lost)

    def _census_done(self, lost: str) -> None:
        order = self.order
        census = self.censuses.pop(lost)
        error = self.roster.lost[lost]
        out: list[WorkerEvent] = []
        unowned = [t for t in order.tracks.values() if t.inc <= census.upto and t.req.request_id not in census.owned]
        for track in unowned:
            order.fail(track, f"{error} (the request was lost in transit)", out)
        order.deliver(out)
