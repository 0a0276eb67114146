"""The fleet's order and loss handling on their own (distributed/order.py, losses.py, fleet.py):
a `Fleet` that is never launched, with fake workers that record what it asks of them. No Ray,
no models: what Ray and the actors would report is handed to `Fleet.receive` and `Fleet.lost`
as the `RemoteWorker`s would."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from tokenrouter import SamplingParams
from tokenrouter.config import EngineOptions
from tokenrouter.distributed import Fleet, wire
from tokenrouter.distributed.links import PeerLink
from tokenrouter.distributed.remote_worker import RemoteWorker
from tokenrouter.engine import HandOff, Request, SeqStatus, WorkerEvent


class FakeLocal:
    """A worker in the caller's process: records aborts and hand-offs; its census call waits
    for the test to `answer`."""

    def __init__(self, name: str):
        self.name = name
        self.error: str | None = None
        self.alive = True
        self.accepts = True  # what hand_off returns
        self.peers: dict = {}
        self.log: list[tuple] = []
        self.pending: list[tuple] = []  # (fn, future) of call()s not answered yet

    def abort(self, request_id: str) -> None:
        self.log.append(("abort", request_id))

    def release(self, request_id: str) -> None:
        self.log.append(("release", request_id))

    def hand_off(self, msg, req: Request) -> bool:
        self.log.append(("hand_off", req.request_id))
        return self.accepts

    def call(self, fn) -> Future:
        future: Future = Future()
        self.pending.append((fn, future))
        return future

    def answer(self, running=(), pending=()) -> None:
        """Run the census call on a core where `running` run and `pending` are away at a peer."""
        fn, future = self.pending.pop(0)
        seqs = {rid: SimpleNamespace(status=SeqStatus.RUNNING) for rid in running}
        seqs.update({rid: SimpleNamespace(status=SeqStatus.PENDING) for rid in pending})
        future.set_result(fn(SimpleNamespace(seqs=seqs)))


class FakeRemote:
    """The caller's handle on a worker in an actor: records what the fleet tells it."""

    def __init__(self, name: str):
        self.name = name
        self.error: str | None = None
        self.alive = True
        self.log: list[tuple] = []

    def abort_incarnation(self, request_id: str, inc: int) -> None:
        self.log.append(("abort_incarnation", request_id, inc))

    def abort(self, request_id: str) -> None:
        self.log.append(("abort", request_id))

    def peer_lost(self, name: str, error: str) -> None:
        self.log.append(("peer_lost", name))

    def mark_lost(self, error: str) -> None:
        self.log.append(("mark_lost", error))
        self.alive = False
        if self.error is None:
            self.error = error


def make_fleet(local=("s",), remote=("a", "b")):
    """A fleet with fake workers, never launched; `delivered` is what its sink got, in order."""
    delivered: list[WorkerEvent] = []
    fleet = Fleet({}, None, EngineOptions(), {}, delivered.extend, lambda: 0, None)
    roster = fleet.roster
    for name in local:
        roster.local[name] = FakeLocal(name)
    for name in remote:
        roster.remote[name] = FakeRemote(name)
    roster.workers.update(roster.local)
    roster.workers.update(roster.remote)
    for worker in roster.local.values():  # its lines to the actors, as launch makes them
        worker.peers = {n: PeerLink(n, None, f"caller/{worker.name}", fleet.leave) for n in remote}
    return fleet, delivered


def submit(fleet: Fleet, rid: str, entry: str) -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(max_tokens=8), 0, frozenset(), 8)
    fleet.submitted(req, entry)
    return req


def event(rid: str, model: str, token: int, **kw) -> WorkerEvent:
    return WorkerEvent(rid, [token], model, **kw)


def from_actor(fleet: Fleet, name: str, *numbered: tuple[WorkerEvent, int], census=()) -> None:
    """A batch from `name`'s actor, as its RemoteWorker hands it on."""
    batch = wire.EventBatch(source=name, events=[wire.NumberedEvent(ev, n) for ev, n in numbered])
    batch.census.extend(census)
    fleet.receive(name, batch)


def ends(delivered: list[WorkerEvent]) -> dict[str, WorkerEvent]:
    return {ev.request_id: ev for ev in delivered if ev.finish_reason is not None}


# ---- order --------------------------------------------------------------------------------------
WRITTEN = [  # one request's events: written by "a", handed to "b", which ends it
    (event("r", "a", 10), 0),
    (event("r", "a", 11, handoff_to="b"), 1),
    (event("r", "b", 12), 2),
    (event("r", "b", 13), 3),
    (event("r", "b", 14, finish_reason="length"), 4),
]


def test_a_requests_events_are_delivered_in_the_order_written_whatever_order_they_arrive_in():
    for arrival in itertools.permutations(range(len(WRITTEN))):
        fleet, delivered = make_fleet()
        submit(fleet, "r", "a")
        for i in arrival:
            ev, n = WRITTEN[i]
            from_actor(fleet, ev.model, (ev, n))
            from_actor(fleet, ev.model, (ev, n))  # a copy that comes twice is delivered once
        assert [ev.token_ids[0] for ev in delivered] == [10, 11, 12, 13, 14], arrival
        assert fleet.order.tracks == {}, arrival  # it ended: no longer followed


def test_events_written_here_and_in_an_actor_follow_one_numbering():
    """A request that starts on a worker in this process and moves to an actor: the actor
    numbers its events from where the request left (`leave`, what the PeerLink asks)."""
    fleet, delivered = make_fleet()
    submit(fleet, "r", "s")
    inc = fleet.incarnation("r")
    fleet.order.local_sink([event("r", "s", 10), event("r", "s", 11)])
    fleet.order.local_sink([event("r", "s", 12, handoff_to="a")])  # a step's events go before its hand-offs
    assert fleet.leave("r") == (3, inc)
    from_actor(fleet, "a", (event("r", "a", 14, finish_reason="stop"), 4))  # before its turn: held
    assert len(delivered) == 3
    from_actor(fleet, "a", (event("r", "a", 13), 3))
    assert [ev.token_ids[0] for ev in delivered] == [10, 11, 12, 13, 14]
    assert ends(delivered)["r"].finish_reason == "stop"


def test_a_request_handed_here_before_its_events_arrived_is_numbered_from_where_it_left():
    """An actor hands a request to a worker here (its event number comes with it) before the
    actor's events reach the fleet: this worker's events wait for them, and when it hands the
    request on, the next actor numbers from after this worker's events."""
    fleet, delivered = make_fleet()
    s = fleet.roster.local["s"]
    req = submit(fleet, "r", "a")
    inc = fleet.incarnation("r")
    batch = wire.EventBatch(source="a")
    batch.to_caller.append(wire.ToCaller("s", handoff=wire.ForIncarnation(HandOff(None, req), inc, 2)))
    fleet.receive("a", batch)  # its events 0 and 1 come in a later batch
    assert s.log == [("hand_off", "r")]
    fleet.order.local_sink([event("r", "s", 12), event("r", "s", 13, handoff_to="b")])
    assert delivered == []  # held: 0 and 1 have not come
    assert fleet.leave("r") == (4, inc)
    from_actor(fleet, "b", (event("r", "b", 14, finish_reason="stop"), 4))
    from_actor(fleet, "a", (event("r", "a", 10), 0), (event("r", "a", 11, handoff_to="s"), 1))
    assert [ev.token_ids[0] for ev in delivered] == [10, 11, 12, 13, 14]


def test_a_copy_of_an_event_already_delivered_is_dropped():
    fleet, delivered = make_fleet()
    submit(fleet, "r", "a")
    from_actor(fleet, "a", (event("r", "a", 10), 0), (event("r", "a", 11), 1))
    from_actor(fleet, "a", (event("r", "a", 10), 0))  # sent again (a batch by the channel and by take)
    track = fleet.order.tracks["r"]
    assert [ev.token_ids[0] for ev in delivered] == [10, 11]
    assert (track.expected, track.held) == (2, {})  # nothing kept for it


# ---- loss ---------------------------------------------------------------------------------------
ERROR_A = "worker 'a' died: its Ray actor was lost (RayActorError: gone)"
ERROR_B = "worker 'b' died: its Ray actor was lost (RayActorError: gone)"


def test_a_lost_workers_requests_end_with_an_error_naming_it_and_the_survivors_free_their_copies():
    fleet, delivered = make_fleet()
    s, a, b = fleet.roster.local["s"], fleet.roster.remote["a"], fleet.roster.remote["b"]
    r1, r2 = submit(fleet, "r1", "a"), submit(fleet, "r2", "b")
    inc1 = fleet.incarnation("r1")
    from_actor(fleet, "a", (event("r1", "a", 10), 0))
    fleet.lost("a", ERROR_A)
    end = ends(delivered)
    assert set(end) == {"r1"}  # r2, on a survivor, goes on
    assert end["r1"].finish_reason == "error" and "'a'" in end["r1"].error
    assert r1.aborted and not r2.aborted
    assert ("abort_incarnation", "r1", inc1) in b.log  # the survivors free their copies
    assert ("abort", "r1") in s.log
    assert a.log == [("mark_lost", ERROR_A)]  # the lost one is told nothing else
    assert ("peer_lost", "a") in b.log  # a census is asked of every survivor
    assert len(s.pending) == 1
    assert s.peers["a"].error == ERROR_A and not s.peers["a"].hand_off(None, r2)  # refuses hand-offs to it
    fleet.lost("a", ERROR_A)  # its poll and its stopped batch may both report it: once is enough
    assert len(ends(delivered)) == 1 and a.log == [("mark_lost", ERROR_A)] and len(s.pending) == 1


def test_an_actor_going_away_while_the_fleet_closes_is_no_loss():
    fleet, delivered = make_fleet()
    submit(fleet, "r1", "a")
    fleet.close()
    fleet.lost("a", ERROR_A)
    assert delivered == [] and fleet.roster.lost == {}


def test_a_request_no_survivor_owns_after_a_loss_fails_as_lost_in_transit():
    fleet, delivered = make_fleet()
    s = fleet.roster.local["s"]
    submit(fleet, "r1", "b")  # as far as the fleet knows on "b"; "b" had handed it to "a"
    submit(fleet, "r2", "b")
    submit(fleet, "r3", "s")  # on its way from "s" to "a": pending at "s"
    fleet.lost("a", ERROR_A)
    assert ends(delivered) == {}  # nobody has answered yet
    submit(fleet, "r4", "b")  # submitted after the loss: the census does not cover it
    from_actor(fleet, "b", census=[wire.Census("a", ["r2"])])
    assert ends(delivered) == {}  # "s" has not answered
    s.answer(running=[], pending=["r3"])
    end = ends(delivered)
    assert set(end) == {"r1", "r3"}
    for rid in ("r1", "r3"):
        assert end[rid].finish_reason == "error"
        assert end[rid].error == f"{ERROR_A} (the request was lost in transit)"
    assert fleet.losses.censuses == {}


def test_a_census_waiting_on_a_worker_lost_meanwhile_finishes():
    fleet, delivered = make_fleet()
    s = fleet.roster.local["s"]
    submit(fleet, "r1", "s")  # on "s", which says so
    submit(fleet, "r2", "b")  # on "b", which is lost next
    submit(fleet, "r3", "s")  # left "s" for "a": nobody owns it
    fleet.lost("a", ERROR_A)
    s.answer(running=["r1"], pending=["r3"])
    assert ends(delivered) == {} and set(fleet.losses.censuses["a"].waiting) == {"b"}
    fleet.lost("b", ERROR_B)  # before it answered "a"'s census
    end = ends(delivered)
    assert end["r2"].error == ERROR_B  # "b" owned it
    assert end["r3"].error == f"{ERROR_A} (the request was lost in transit)"
    assert "r1" not in end
    assert set(fleet.losses.censuses) == {"b"}  # "a"'s finished; "b"'s waits on "s"
    s.answer(running=["r1"])
    assert fleet.losses.censuses == {} and "r1" not in ends(delivered)


def test_a_handoff_to_a_worker_already_lost_fails_the_request():
    fleet, delivered = make_fleet()
    a = fleet.roster.remote["a"]
    req = submit(fleet, "r", "a")
    inc = fleet.incarnation("r")
    fleet.lost("b", ERROR_B)
    from_actor(fleet, "a", (event("r", "a", 11, handoff_to="b"), 1), (event("r", "a", 10), 0))
    assert [ev.token_ids for ev in delivered] == [[10], [11], []]
    end = delivered[-1]
    assert end.finish_reason == "error" and end.error == ERROR_B and end.model == "b"
    assert req.aborted
    assert ("abort_incarnation", "r", inc) in a.log
    from_actor(fleet, "a", (event("r", "a", 12), 2))  # anything later of it is dropped
    assert len(delivered) == 3


@pytest.mark.parametrize(("error", "reason"), [(None, "abort"), ("worker 's' died: boom", "error")])
def test_a_handoff_a_worker_here_refuses_ends_the_request(error, reason):
    fleet, delivered = make_fleet()
    s = fleet.roster.local["s"]
    s.accepts, s.error = False, error
    req = submit(fleet, "r", "a")
    inc = fleet.incarnation("r")
    handoff = wire.ForIncarnation(HandOff(None, req), inc, 1)
    batch = wire.EventBatch(source="a", events=[wire.NumberedEvent(event("r", "a", 10, handoff_to="s"), 0)])
    batch.to_caller.append(wire.ToCaller("s", handoff=handoff))
    fleet.receive("a", batch)
    assert ("hand_off", "r") in s.log
    end = ends(delivered)["r"]
    assert end.finish_reason == reason
    assert end.error == (error or "worker 's' is not running")
    assert req.aborted


# ---- what a RemoteWorker uses of the fleet ------------------------------------------------------
class FakeHooks:
    """`remote_worker.FleetHooks`, recording."""

    def __init__(self):
        self.log: list[tuple] = []
        self.in_flight = lambda: 3

    def incarnation(self, request_id: str) -> int:
        return 7

    def leave(self, request_id: str) -> tuple[int, int]:
        return 5, 7

    def lost(self, name: str, error: str) -> None:
        self.log.append(("lost", name, error))

    def receive(self, name: str, batch) -> None:
        self.log.append(("receive", name, len(batch.events)))


class FakeHandle:
    """An actor handle whose `post` keeps the envelopes."""

    def __init__(self):
        self.posted: list = []
        self.post = SimpleNamespace(remote=lambda data: self.posted.append(wire.loads(data)))


def test_a_remote_worker_needs_only_its_hooks():
    hooks, handle = FakeHooks(), FakeHandle()
    worker = RemoteWorker("a", SimpleNamespace(max_num_seqs=8), handle, hooks, None, "caller", 1)
    worker.facts = SimpleNamespace()  # as if loaded
    req = Request("r", [1], SamplingParams(), 0, frozenset(), 4)
    assert worker.submit(req) and worker.hand_off(None, req)
    submitted, handed = (env.items[0] for env in handle.posted)
    assert (submitted.inc, handed.inc, handed.event_seq) == (7, 7, 5)
    worker.on_batch(wire.EventBatch(source="a", events=[wire.NumberedEvent(event("r", "a", 1), 0)]))
    worker.on_batch(wire.EventBatch(source="a", alive=False, error="worker 'a' died: boom", stopped=True))
    assert hooks.log == [("receive", "a", 1), ("receive", "a", 0), ("lost", "a", "worker 'a' died: boom")]
    fleet, _ = make_fleet()
    for name in ("in_flight", "incarnation", "leave", "lost", "receive"):  # the fleet is its hooks
        assert callable(getattr(fleet, name))
