"""`WorkerThread` (engine/worker/thread.py) on its own, around a fake core: the inbox reaches the
core in order and only between steps, the hold for B (delayed batching), the order a step's
results go out in (releases, then events, then hand-offs), `call`, shut-down, and death.

The engine's tests see these only through real models, where a broken order or hold shows up as
an occasional wrong token; here each is checked directly, deterministically: the tests wait on
what the worker did (events, its calls into the core), never on time passing."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from tokenrouter import SamplingParams
from tokenrouter.engine import Request, WorkerSettings, WorkerThread
from tokenrouter.engine.core_stats import CoreStats
from tokenrouter.engine.outbox import Outbox, PeerHandOff, WorkerEvent
from tokenrouter.policies import PeerMessage

TIMEOUT = 5.0  # a generous deadline for anything the worker's thread should do at once


class Log:
    """What happened, in order, across threads: the core, the peers and the sink all write here."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entries: list[tuple] = []

    def add(self, *entry) -> None:
        with self.cond:
            self.entries.append(entry)
            self.cond.notify_all()

    def snapshot(self) -> list[tuple]:
        with self.cond:
            return list(self.entries)

    def wait_for(self, predicate, what: str) -> list[tuple]:
        """Block until `predicate(entries)` holds (a failure after TIMEOUT); return the entries."""
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.entries), TIMEOUT), f"timed out waiting for {what}"
            return list(self.entries)

    def of(self, *kinds: str) -> list[tuple]:
        return [e for e in self.snapshot() if e[0] in kinds]


def has(entry: tuple):
    return lambda entries: entry in entries


def request(i: int) -> Request:
    return Request(f"r{i}", [1, 2, 3], SamplingParams(), seed=0, stop_token_ids=frozenset(), max_tokens=4)


def finish(request_ids: list[str], reason: str = "length", model: str = "m") -> Outbox:
    """An outbox that ends each request, as a step that sampled its last token would."""
    return Outbox(
        events=[WorkerEvent(rid, [7], model, finish_reason=reason) for rid in request_ids],
        releases=list(request_ids),
    )


class FakeCore:
    """The members of `ModelCore` that `WorkerThread` uses. Every call is logged with the thread
    it ran in; requests it holds are ready to step unless `hold_back` is set."""

    def __init__(self, log: Log, name: str = "m", max_num_seqs: int = 8):
        self.name = name
        self.spec = SimpleNamespace(max_num_seqs=max_num_seqs, device="cpu")
        self.log = log
        self.loaded = None
        self.torch_threads: int | None = None
        self.held: dict[str, Request] = {}  # by id, in arrival order
        self.hold_back = False  # nothing is ready: what it holds stays (as if waiting for blocks)
        self.in_step = False
        self.threads: set[str] = set()  # the threads that called into the core
        self.load_error: BaseException | None = None
        # what a step returns, given the ids it stepped (it may raise); by default it ends them.
        # The requests it ends (releases) or hands off are no longer held; the rest stay ready.
        self.on_step = lambda ids: finish(ids, model=self.name)
        # while set, each step blocks until `resume` is set, after setting `stepping`
        self.pause_steps = False
        self.stepping = threading.Event()
        self.resume = threading.Event()

    def record(self, *entry) -> None:
        self.threads.add(threading.current_thread().name)
        self.log.add(*entry)

    def load(self, compute, forward_threads):
        self.record("load", compute, forward_threads)
        if self.load_error is not None:
            raise self.load_error
        self.torch_threads = forward_threads
        self.loaded = SimpleNamespace(name=self.name)
        return self.loaded

    @property
    def num_ready(self) -> int:
        n = 0 if self.hold_back else len(self.held)
        self.record("ready", n)
        return n

    def add(self, req: Request) -> None:
        self.record("add", req.request_id)
        self.held[req.request_id] = req

    def receive(self, msg, req: Request, out: Outbox, refuse: bool = False, error: str | None = None) -> None:
        self.record("receive", req.request_id, msg.tokens, refuse, error)
        if not refuse:
            self.held[req.request_id] = req

    def abort(self, request_id: str, out: Outbox) -> None:
        self.record("abort", request_id)
        if self.held.pop(request_id, None) is not None:
            out.events.append(WorkerEvent(request_id, [], self.name, finish_reason="abort"))

    def release(self, request_id: str) -> None:
        self.record("core-release", request_id)
        self.held.pop(request_id, None)

    def end_request(self, request_id: str, reason: str, error: str | None, out: Outbox) -> None:
        self.record("end_request", request_id, reason, error)
        self.held.pop(request_id, None)
        out.releases.append(request_id)
        out.events.append(WorkerEvent(request_id, [], self.name, finish_reason=reason, error=error))

    def end_all(self, reason: str, error: str | None, out: Outbox) -> None:
        self.record("end_all", reason, error)
        for request_id in self.held:
            out.releases.append(request_id)
            out.events.append(WorkerEvent(request_id, [], self.name, finish_reason=reason, error=error))
        self.held.clear()

    def step(self) -> Outbox:
        ids = list(self.held)
        self.record("step", ids)
        self.in_step = True
        try:
            if self.pause_steps:
                self.stepping.set()
                assert self.resume.wait(TIMEOUT), "the test never resumed the step"
            out = self.on_step(ids)
            for request_id in [*out.releases, *(h.req.request_id for h in out.handoffs)]:
                self.held.pop(request_id, None)  # ended here, or gone to a peer
            self.record("step-end")
            return out
        finally:
            self.in_step = False

    def stats(self) -> CoreStats:
        return CoreStats(
            model=self.name,
            kv_blocks_total=0,
            kv_blocks_free=0,
            kv_block_size=16,
            prefix_cache_hit_tokens=0,
            kv_cache_bytes=0,
            running=len(self.held),
            waiting=0,
            pending=0,
            preemptions=0,
            evictions=0,
            steps=len(self.log.of("step")),
            tokens_processed=0,
            handoffs_received=0,
            handoffs_sent=0,
            batch_size_histogram={},
            time_forward_s=0.0,
            time_step_s=0.0,
            attention_backend="torch",
            cuda_graph_batch_sizes=[],
            torch_threads=self.torch_threads,
            steps_by_threads={},
        )

    def routing_counters(self) -> dict[str, float | dict[int, int]]:
        return {"steps": float(len(self.log.of("step")))}


class FakePeer:
    """A peer worker as the stepping worker sees it: it logs what it is sent; `accept` False
    refuses hand-offs (as a stopped or dead worker's closed inbox does)."""

    def __init__(self, name: str, log: Log, accept: bool = True, error: str | None = None):
        self.name = name
        self.log = log
        self.accept = accept
        self.error = error

    def release(self, request_id: str) -> None:
        self.log.add("release", self.name, request_id)

    def hand_off(self, msg, req: Request) -> bool:
        self.log.add("hand_off", self.name, req.request_id, self.accept)
        return self.accept


def sink_into(log: Log):
    return lambda events: log.add("sink", [(e.request_id, e.finish_reason, e.error) for e in events])


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
def make_worker(log):
    """Start a WorkerThread around a core (stopped and joined after the test)."""
    workers: list[WorkerThread] = []

    def make(core: FakeCore, sink=None, **settings) -> WorkerThread:
        settings.setdefault("num_threads", 1)  # keep torch's process-wide thread count as the tests set it
        worker = WorkerThread(core, sink or sink_into(log), WorkerSettings(**settings))
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for worker in workers:
        worker.stop()
    for worker in workers:
        assert worker.join(TIMEOUT), f"worker {worker.name!r} did not stop"


def after_a_full_turn(worker: WorkerThread) -> None:
    """Return once the worker has applied everything posted so far and gone round its loop once
    more: a call posted now is applied in a later drain than anything already applied."""
    assert worker.call(lambda core: None).result(TIMEOUT) is None


def submit_and_hold(log: Log, worker: WorkerThread, req: Request, ready: int) -> None:
    """Submit `req`, wait until the worker sees `ready` requests ready, then until it has decided
    what to do about them (step or hold) and gone round its loop again."""
    mark = len(log.snapshot())
    assert worker.submit(req)
    log.wait_for(lambda es: ("ready", ready) in es[mark:], f"{ready} requests ready")
    after_a_full_turn(worker)


# ---- set-up ------------------------------------------------------------------------------------
def test_load_runs_in_the_worker_thread(log, make_worker):
    core = FakeCore(log)
    worker = make_worker(core)
    assert worker.wait_ready() is core.loaded
    assert log.of("load") == [("load", None, 1)]  # no shared CPU: no compute thread; num_threads=1
    assert core.threads == {worker.thread.name} and worker.thread is not threading.current_thread()
    assert worker.alive and worker.torch_threads == 1 and worker.routing_counters() == {"steps": 0.0}


def test_a_failed_load_reaches_wait_ready_and_the_worker_refuses_posts(log, make_worker):
    core = FakeCore(log)
    core.load_error = FileNotFoundError("no weights")
    worker = make_worker(core)
    with pytest.raises(FileNotFoundError, match="no weights"):
        worker.wait_ready()
    assert worker.load_failed
    assert worker.join(TIMEOUT) and not worker.alive
    assert worker.submit(request(0)) is False
    assert log.of("add", "step", "end_all") == []


# ---- the inbox -----------------------------------------------------------------------------------
def test_requests_from_another_thread_reach_the_core_in_order_between_steps(log, make_worker):
    core = FakeCore(log)
    core.pause_steps = True
    worker = make_worker(core)
    worker.wait_ready()
    assert worker.submit(request(0))
    assert core.stepping.wait(TIMEOUT), "the first request was never stepped"

    posted: list[bool] = []
    poster = threading.Thread(target=lambda: posted.extend(worker.submit(request(i)) for i in range(1, 21)))
    poster.start()
    poster.join(TIMEOUT)
    assert posted == [True] * 20
    assert log.of("add") == [("add", "r0")]  # mid-step: nothing posted since is applied yet
    assert [m.req.request_id for m in worker.inbox.snapshot()] == [f"r{i}" for i in range(1, 21)]

    core.resume.set()
    log.wait_for(lambda es: sum(e[0] == "sink" for e in es) == 2, "the second step's events")
    entries = [e for e in log.snapshot() if e[0] in ("add", "step", "step-end")]
    assert entries == [
        ("add", "r0"),
        ("step", ["r0"]),
        ("step-end",),
        *[("add", f"r{i}") for i in range(1, 21)],  # in the order posted, all before the next step
        ("step", [f"r{i}" for i in range(1, 21)]),
        ("step-end",),
    ]
    assert core.threads == {worker.thread.name}  # the core is only ever touched by its own thread


def test_an_abort_posted_mid_step_is_reported_after_that_steps_tokens(log, make_worker):
    core = FakeCore(log)
    core.pause_steps = True
    core.on_step = lambda ids: Outbox(events=[WorkerEvent(rid, [7], "m") for rid in ids])  # a token, no end
    worker = make_worker(core)
    worker.wait_ready()
    worker.submit(request(0))
    assert core.stepping.wait(TIMEOUT)
    worker.abort("r0")
    core.resume.set()
    log.wait_for(has(("sink", [("r0", "abort", None)])), "the abort's event")
    # the step's results go out before anything posted during it is applied
    assert log.of("sink", "abort") == [
        ("sink", [("r0", None, None)]),
        ("abort", "r0"),
        ("sink", [("r0", "abort", None)]),
    ]
    assert log.of("step") == [("step", ["r0"])]


def test_abort_and_release_reach_the_core_and_an_abort_is_reported(log, make_worker):
    core = FakeCore(log)
    core.hold_back = True
    worker = make_worker(core)
    worker.wait_ready()
    for i in range(3):
        worker.submit(request(i))
    worker.abort("r1")
    worker.release("r2")
    log.wait_for(has(("sink", [("r1", "abort", None)])), "the abort's event")
    assert log.of("add", "abort", "core-release") == [
        ("add", "r0"),
        ("add", "r1"),
        ("add", "r2"),
        ("abort", "r1"),
        ("core-release", "r2"),
    ]
    assert list(core.held) == ["r0"] and log.of("step") == []


def test_stop_ends_the_loop_then_posts_are_refused_and_held_requests_end_as_aborted(log, make_worker):
    core = FakeCore(log)
    core.hold_back = True  # the requests stay held: nothing is stepped
    worker = make_worker(core)
    peer = FakePeer("p", log)
    worker.connect({"m": worker, "p": peer})
    assert list(worker.peers) == ["p"]  # never its own peer
    worker.wait_ready()
    assert worker.submit(request(0)) and worker.submit(request(1))
    log.wait_for(has(("add", "r1")), "both requests added")
    assert worker.submit(request(2))  # posted just before the stop: applied, then ended with the others
    worker.stop()
    assert worker.join(TIMEOUT), "stop() did not end the loop"
    assert not worker.alive and worker.error is None

    assert worker.submit(request(3)) is False
    assert worker.hand_off(PeerMessage("r4", "p", "m", [5]), request(4)) is False
    with pytest.raises(RuntimeError, match="not running"):
        worker.call(lambda core: None).result(TIMEOUT)
    assert log.of("end_all") == [("end_all", "abort", None)]
    assert log.of("sink") == [("sink", [("r0", "abort", None), ("r1", "abort", None), ("r2", "abort", None)])]
    assert log.of("release") == [("release", "p", f"r{i}") for i in range(3)]  # their copies at peers go too
    assert log.of("add")[-1] == ("add", "r2") and log.of("step") == []


# ---- the hold for B (delayed batching) -----------------------------------------------------------
def test_the_hold_for_b_waits_until_batch_min_requests_are_ready(log, make_worker):
    core = FakeCore(log)
    worker = make_worker(core, batch_min=3, batch_wait_s=60.0)  # far longer than the test
    worker.wait_ready()
    submit_and_hold(log, worker, request(0), 1)
    submit_and_hold(log, worker, request(1), 2)
    assert log.of("step") == [], "stepped with fewer than batch_min ready"
    worker.submit(request(2))
    log.wait_for(has(("step-end",)), "a step once 3 were ready")
    assert log.of("step") == [("step", ["r0", "r1", "r2"])]


def test_the_hold_for_b_ends_after_batch_wait_s(log, make_worker):
    core = FakeCore(log)
    wait_s = 0.2
    worker = make_worker(core, batch_min=3, batch_wait_s=wait_s)
    worker.wait_ready()
    t0 = time.perf_counter()
    worker.submit(request(0))
    log.wait_for(has(("step-end",)), "a step after batch_wait_s")
    held_for = time.perf_counter() - t0
    assert log.of("step") == [("step", ["r0"])]
    assert held_for >= wait_s  # a lower bound only: the hold starts after the submit
    assert worker.stats().time_waiting_for_batch_s > 0


def test_set_batch_min_from_another_thread_takes_effect(log, make_worker):
    core = FakeCore(log, max_num_seqs=8)
    worker = make_worker(core, batch_min=50, batch_wait_s=60.0)
    assert worker.batch_min == 8  # B never exceeds what a step can hold
    worker.wait_ready()
    submit_and_hold(log, worker, request(0), 1)
    assert log.of("step") == []

    setter = threading.Thread(target=worker.set_batch_min, args=(0,))
    setter.start()
    setter.join(TIMEOUT)
    assert worker.batch_min == 1  # at least 1
    log.wait_for(has(("step-end",)), "a step once B dropped to 1")  # the hold of 60 s is cut short
    assert log.of("step") == [("step", ["r0"])]

    setter = threading.Thread(target=worker.set_batch_min, args=(2,))
    setter.start()
    setter.join(TIMEOUT)
    assert worker.batch_min == 2
    submit_and_hold(log, worker, request(1), 1)
    assert log.of("step") == [("step", ["r0"])], "stepped one request with B raised to 2"
    worker.submit(request(2))
    log.wait_for(lambda es: es.count(("step-end",)) == 2, "a step once 2 were ready")
    assert log.of("step")[-1] == ("step", ["r1", "r2"])
    assert worker.stats().batch_min == 2


# ---- delivery ----------------------------------------------------------------------------------
def test_a_steps_releases_go_out_first_then_its_events_then_its_handoffs(log, make_worker):
    core = FakeCore(log)
    core.on_step = lambda ids: Outbox(
        events=[WorkerEvent("r0", [7], "m"), WorkerEvent("r1", [8], "m", handoff_to="b")],
        handoffs=[
            PeerHandOff("a", PeerMessage("r0", "m", "a", [7]), request(0)),
            PeerHandOff("b", PeerMessage("r1", "m", "b", [8]), request(1)),
        ],
        releases=["x", "y"],
    )
    worker = make_worker(core)
    worker.connect({"a": FakePeer("a", log), "b": FakePeer("b", log)})
    worker.wait_ready()
    worker.submit(request(0))
    log.wait_for(lambda es: sum(e[0] == "hand_off" for e in es) == 2, "both hand-offs")
    assert log.of("release", "sink", "hand_off") == [
        ("release", "a", "x"),
        ("release", "b", "x"),
        ("release", "a", "y"),
        ("release", "b", "y"),
        ("sink", [("r0", None, None), ("r1", None, None)]),  # the step's events, in one call
        ("hand_off", "a", "r0", True),
        ("hand_off", "b", "r1", True),
    ]
    assert log.of("end_request") == []


@pytest.mark.parametrize(("peer_error", "reason"), [(None, "abort"), ("worker 'b' died: boom", "error")])
def test_a_refused_handoff_ends_its_request_and_the_end_is_delivered(log, make_worker, peer_error, reason):
    core = FakeCore(log)
    core.on_step = lambda ids: Outbox(
        events=[WorkerEvent("r0", [7], "m"), WorkerEvent("r1", [8], "m")],
        handoffs=[
            PeerHandOff("a", PeerMessage("r0", "m", "a", [7]), request(0)),
            PeerHandOff("b", PeerMessage("r1", "m", "b", [8]), request(1)),
        ],
    )
    worker = make_worker(core)
    worker.connect({"a": FakePeer("a", log), "b": FakePeer("b", log, accept=False, error=peer_error)})
    worker.wait_ready()
    worker.submit(request(0))
    end = ("sink", [("r1", reason, peer_error)])
    log.wait_for(has(end), "the refused request's end")
    assert log.of("release", "sink", "hand_off", "end_request") == [
        ("sink", [("r0", None, None), ("r1", None, None)]),
        ("hand_off", "a", "r0", True),
        ("hand_off", "b", "r1", False),
        ("end_request", "r1", reason, peer_error),  # a dead peer's error; a stopped one's is an abort
        ("release", "a", "r1"),  # the end goes out like a step's: releases, then the event
        ("release", "b", "r1"),
        end,
    ]


def test_a_handoff_reaches_the_peer_workers_core_in_its_own_thread(log, make_worker):
    core_a, core_b = FakeCore(log, name="a"), FakeCore(log, name="b")
    core_a.on_step = lambda ids: Outbox(handoffs=[PeerHandOff("b", PeerMessage("r0", "a", "b", [7, 8]), request(0))])
    a, b = make_worker(core_a), make_worker(core_b)
    peers = {"a": a, "b": b}
    a.connect(peers)
    b.connect(peers)
    a.wait_ready()
    b.wait_ready()
    a.submit(request(0))
    entries = log.wait_for(lambda es: es.count(("step-end",)) == 2, "a's step, then b's")
    received = entries.index(("receive", "r0", [7, 8], False, None))  # not refused: b is serving
    assert entries.index(("step", ["r0"])) < received < entries.index(("step", ["r0"]), received)
    assert core_a.threads == {a.thread.name} and core_b.threads == {b.thread.name}


# ---- call ----------------------------------------------------------------------------------------
def test_call_runs_in_the_worker_thread_between_steps_and_returns_its_result_or_error(log, make_worker):
    core = FakeCore(log)
    core.pause_steps = True
    worker = make_worker(core)
    worker.wait_ready()
    worker.submit(request(0))
    assert core.stepping.wait(TIMEOUT)

    def peek(c: FakeCore):
        c.record("call")
        return threading.current_thread().name, c.in_step, c is core

    future = worker.call(peek)
    assert not future.done()  # the worker is mid-step: the call waits for the step to end
    core.resume.set()
    assert future.result(TIMEOUT) == (worker.thread.name, False, True)
    entries = log.of("step", "step-end", "call")
    assert entries.index(("call",)) > entries.index(("step-end",))

    def fail(c: FakeCore):
        raise ValueError("bad call")

    err = worker.call(fail).exception(TIMEOUT)
    assert isinstance(err, ValueError) and str(err) == "bad call"
    assert worker.call(lambda c: 42).result(TIMEOUT) == 42  # a failed call leaves the worker serving
    assert worker.alive and worker.error is None


# ---- death -------------------------------------------------------------------------------------
class CoreCrash(BaseException):
    """Not an Exception: what only the loop's last-resort handler catches."""


@pytest.mark.parametrize("crash", [CoreCrash("boom"), RuntimeError("boom")], ids=["BaseException", "Exception"])
def test_an_error_escaping_a_step_kills_the_worker_and_names_itself(log, make_worker, crash):
    core = FakeCore(log)

    def step(ids):
        raise crash

    core.on_step = step
    core.pause_steps = True
    worker = make_worker(core)
    worker.wait_ready()
    worker.submit(request(0))
    assert core.stepping.wait(TIMEOUT)
    assert worker.submit(request(1))  # accepted mid-step, before the crash: it must end too
    core.resume.set()
    assert worker.join(TIMEOUT), "the worker's thread outlived its error"
    error = f"worker 'm' died: {type(crash).__name__}: boom"
    assert worker.error == error and not worker.alive
    assert log.of("end_all") == [("end_all", "error", error)]
    assert log.of("sink") == [("sink", [("r0", "error", error), ("r1", "error", error)])]  # all end, with the error
    stats = worker.stats()
    assert not stats.alive and stats.error == error
    assert worker.submit(request(1)) is False
    with pytest.raises(RuntimeError, match="died"):
        worker.call(lambda c: None).result(TIMEOUT)
