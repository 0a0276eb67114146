"""One model's worker in a Ray actor: the same `ModelCore` and stepping thread as in one
process, with its messages carried between processes.

The actor runs a `LinkedWorker` (a `WorkerThread`). What it receives comes in envelopes
(by Ray, `post`, or on a peer's direct channel, `channel.py`; applied one at a time, in each
sender's order) and goes into the worker's inbox as in one process. What it sends goes out once
per step: hand-offs straight to the peer actors, one frame (or Ray call) per peer; events,
hand-offs for workers in the caller's process and census answers in one batch to the caller, on
its direct channel (else kept for `take`, the long poll the caller keeps open, which is also
how the caller learns that the actor died; `caller_queue.py`). Its Ray methods run in three
thread groups, so that a poll, an envelope being applied and a call for statistics never wait on
each other.

Requests cross processes as copies, so a flag the caller sets on its `Request` is not seen here:
an abort is a message, remembered per (request id, incarnation) for a hand-off that arrives
after it (it ends on arrival, as an in-process one does when it finds the flag set). Each event
is numbered per request across workers (`wire.NumberedEvent`), the number travelling with the
request when it moves.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import ray
import torch

from ..config import ModelSpec
from ..engine import ModelCore, Request, WorkerEvent, WorkerSettings
from ..errors import ConfigError, ModelLoadError
from ..policies import Policy
from . import wire
from .caller_queue import CallerPeer, CallerQueue, Tracks
from .channel import Channel, ChannelServer
from .in_order import InOrder
from .linked_worker import LinkedWorker, owned_requests
from .links import CallerLink, PeerLink
from .model_view import ModelFacts

TOMBSTONES = 65536  # aborts remembered for hand-offs still in transit


@dataclass(frozen=True)
class ActorSettings:
    """How the engine runs this worker: its loop (with the torch threads of this process), and
    how it reaches the others."""

    worker: WorkerSettings  # num_threads always set: the actor's CPUs, or the engine's num_threads
    keep_kv_on_handoff: bool
    engine_id: str
    secret: bytes  # what a peer's hand-off channel must present (channel.py)


def on_this_node(spec: ModelSpec) -> ModelSpec:
    """The spec with its path and tokenizer resolved and checked here, on the actor's node."""
    fields = spec.model_dump()
    fields["placement"] = None
    try:
        return ModelSpec.model_validate(fields)
    except ValueError as e:
        raise ModelLoadError(f"on node {os.uname().nodename}: {e}") from None


class ActorWorker(LinkedWorker):
    """The actor's worker: its events go to the caller's queue; when it shuts down it says so."""

    def __init__(self, core: ModelCore, settings: ActorSettings, tracks: Tracks, queue: CallerQueue):
        super().__init__(
            core,
            lambda events: queue.stage_events(tracks.number(events)),
            settings.worker,
            after_delivery=queue.publish,
        )
        self.queue = queue

    def shut_down(self) -> None:
        """The requests' last events stay staged and leave in the final batch, with the worker's
        death: a caller that sees a request end with the error then finds `health()` saying so."""
        self.after_delivery = None
        self.queue.mark_down(self.error)  # before the inbox closes: what it refuses goes out marked
        try:
            super().shut_down()
        finally:
            self.queue.close(wire.EventBatch(alive=False, error=self.error, stopped=True, stats=self.stats()))


@ray.remote(concurrency_groups={"post": 1, "take": 1, "control": 4})
class WorkerActor:
    def __init__(self, name: str, spec: ModelSpec, policy: Policy, settings: ActorSettings):
        torch.set_num_threads(
            settings.worker.num_threads
        )  # this process's default; the worker sets its own thread's too
        self.name = name
        self.settings = settings
        self.sender = f"{settings.engine_id}/{name}"  # what peers see this worker's envelopes come from
        self.tracks = Tracks()
        self.queue = CallerQueue(name)
        self.in_order = InOrder()
        self.tombstones: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.in_flight = 0  # the engine's count of requests in flight, with every poll
        self.peers: dict[str, object] = {}
        self.peer_handles: dict[str, object] = {}
        self.refusals: dict[str, CallerLink] | None = None  # to peers, for requests refused here
        self.worker: ActorWorker | None = None
        self.setup_error: Exception | None = None
        self.post_lock = threading.Lock()  # envelopes by Ray and by the channel, applied one at a time
        self.echoes: dict[int, threading.Event] = {}  # echoes sent to peers, waiting to come back
        self.server = ChannelServer(ray.util.get_node_ip_address(), settings.secret, self.receive)
        self.policy = policy
        policy.use_in_flight(lambda: self.in_flight)  # a policy that plans by load (Speculative(k="auto"))
        try:
            core = ModelCore(name, on_this_node(spec), policy, keep_kv_on_handoff=settings.keep_kv_on_handoff)
            self.worker = ActorWorker(core, settings, self.tracks, self.queue)
        except Exception as e:  # reported by load(), with the caller's error types
            self.setup_error = e

    # ---- set-up (control) ----------------------------------------------------------------
    @ray.method(concurrency_group="control")
    def channel_address(self) -> tuple[str, int]:
        """Where peers connect their hand-off channels to this worker."""
        return self.server.address

    @ray.method(concurrency_group="control")
    def connect(self, peers: dict, caller: tuple[str, int] | None) -> None:
        """`peers`: name -> (the peer's actor handle, its channel address), or None for a worker
        in the caller's process; `caller`: the caller's channel address, for the events."""
        if caller is not None:
            channel = Channel(caller, self.settings.secret)
            if channel.usable:
                self.queue.channel = channel
        self.peer_handles = {n: p[0] for n, p in peers.items() if p is not None and n != self.name}
        links = {
            n: PeerLink(n, p[0], self.sender, self.tracks.leave, Channel(p[1], self.settings.secret))
            if p is not None
            else CallerPeer(n, self.tracks, self.queue)
            for n, p in peers.items()
            if n != self.name
        }
        self.peers = links
        if self.worker is not None:
            self.worker.connect_peers(links)

    @ray.method(concurrency_group="control")
    def load(self) -> ModelFacts | wire.LoadFailure:
        """Load the model in the worker's thread and start serving; its facts for the caller."""
        try:
            if self.setup_error is not None:
                raise self.setup_error
            self.worker.start()
            loaded = self.worker.wait_ready()
        except Exception as e:
            kind = "ConfigError" if isinstance(e, ConfigError) else "ModelLoadError"
            detail = str(e) if isinstance(e, (ConfigError, ModelLoadError)) else f"{type(e).__name__}: {e}"
            return wire.LoadFailure(kind, detail)
        return ModelFacts.of(loaded, self.worker.capacity_tokens, self.worker.torch_threads, self.worker.host)

    # ---- what arrives (post: one thread, senders' order) ---------------------------------
    @ray.method(concurrency_group="post")
    def post(self, data: bytes) -> None:
        """An envelope (`wire.dumps`) from the caller or a peer, by Ray."""
        self.receive(data)

    def receive(self, data: bytes) -> None:
        """An envelope, by Ray or by a peer's channel: applied in its sender's order."""
        if self.worker is None:  # it never loaded: the caller is tearing it down
            return
        with self.post_lock:
            for ready in self.in_order.accept(wire.loads(data)):
                for item in ready.items:
                    self.apply(item)

    def apply(self, item) -> None:
        worker = self.worker
        if isinstance(item, wire.ForIncarnation):
            self.apply_for_incarnation(item)
        elif isinstance(item, wire.Release):
            worker.release(item.request_id)
        elif isinstance(item, wire.Stop):
            worker.stop()
        elif isinstance(item, wire.PeerLost):
            self.peer_lost(item.name, item.error)
        elif isinstance(item, wire.Echo) and item.reply_to is not None:
            peer = self.peers.get(item.reply_to)
            if isinstance(peer, PeerLink):
                peer.link.send([wire.Echo(item.token)])
        elif isinstance(item, wire.Echo):
            waiting = self.echoes.get(item.token)
            if waiting is not None:
                waiting.set()

    def apply_for_incarnation(self, tagged: wire.ForIncarnation) -> None:
        worker, item, inc = self.worker, tagged.item, tagged.inc
        if isinstance(item, wire.Abort):
            self.tombstones[(item.request_id, inc)] = None
            while len(self.tombstones) > TOMBSTONES:
                self.tombstones.popitem(last=False)
            worker.abort(item.request_id)
            return
        self.check_aborted(item.req, inc)
        self.tracks.arrive(item.req.request_id, tagged.event_seq, inc)
        admitted = worker.submit(item.req) if isinstance(item, wire.Submit) else worker.hand_off(item.msg, item.req)
        if not admitted:
            self.refuse(item.req.request_id)

    def check_aborted(self, req: Request, inc: int) -> None:
        """An abort of this incarnation came first: the request ends when it arrives."""
        if (req.request_id, inc) in self.tombstones:
            req.aborted = True

    def refuse(self, request_id: str) -> None:
        """The worker has stopped or died, so a request arriving now ends here (the sender's
        pending copy is released): in one process the sender would have seen the closed inbox."""
        worker = self.worker
        reason = "error" if worker.error is not None else "abort"
        ev = WorkerEvent(request_id, [], self.name, finish_reason=reason, error=worker.error)
        self.queue.stage_events(self.tracks.number([ev]))
        for name, peer in self.peers.items():
            if isinstance(peer, CallerPeer):
                self.queue.stage_to_caller(wire.ToCaller(name, release=request_id))
        if self.peer_handles:
            if self.refusals is None:
                self.refusals = {n: CallerLink(h, f"{self.sender}/refusals") for n, h in self.peer_handles.items()}
            for link in self.refusals.values():
                link.send([wire.Release(request_id)])
        self.queue.publish()

    def peer_lost(self, name: str, error: str) -> None:
        """Refuse hand-offs to a lost peer from now on; then, between steps, report what this
        worker owns (the census that finds requests lost with the peer)."""
        peer = self.peers.get(name)
        if isinstance(peer, PeerLink):
            peer.lost(error)
        future = self.worker.call(owned_requests)
        future.add_done_callback(
            lambda f: self.queue.add_census(wire.Census(name, f.result() if f.exception() is None else []))
        )

    # ---- what goes to the caller ---------------------------------------------------------
    @ray.method(concurrency_group="take")
    def take(self, in_flight: int, wait_s: float) -> bytes:
        """What the channel to the caller did not carry since the last take (a `wire.EventBatch`,
        as `wire.dumps`), waiting up to `wait_s` for something; whether the worker lives. The
        caller keeps one open: a take that fails is how it learns the actor is gone."""
        self.in_flight = in_flight
        batch = self.queue.take(wait_s)
        if not batch.stopped:
            batch.alive, batch.error = self.worker.alive, self.worker.error
        return wire.dumps(batch)

    # ---- calls between steps, statistics (control) ---------------------------------------
    @ray.method(concurrency_group="control")
    def call(self, fn):
        """`fn(core)` in the stepping thread between steps (`WorkerThread.call`); its result."""
        return self.worker.call(fn).result()

    @ray.method(concurrency_group="control")
    def inspect(self, fn):
        """`fn(worker)` now, in this Ray thread, not between steps: for tests and debugging,
        reading state (a value a step is changing may be read half-changed)."""
        return fn(self.worker)

    @ray.method(concurrency_group="control")
    def stats(self):
        return self.worker.stats()

    @ray.method(concurrency_group="control")
    def routing_counters(self) -> dict:
        return self.worker.routing_counters()

    @ray.method(concurrency_group="control")
    def set_batch_min(self, b: int) -> None:
        self.worker.set_batch_min(b)

    @ray.method(concurrency_group="post")
    def ping(self) -> None:
        """Nothing: a round trip by Ray call (the caller's line to this worker)."""

    @ray.method(concurrency_group="control")
    def ping_peers(self, n: int) -> dict[str, float]:
        """Median round trip to each peer actor on the path hand-offs take (its channel, or Ray
        calls), an `Echo` there and back, in seconds."""
        out = {}
        for name, peer in self.peers.items():
            if not isinstance(peer, PeerLink):
                continue
            rtts = []
            for i in range(n + 1):
                token = random.getrandbits(62)
                done = self.echoes[token] = threading.Event()
                t0 = time.perf_counter()
                peer.link.send([wire.Echo(token, reply_to=self.name)])
                answered = done.wait(10.0)
                del self.echoes[token]
                if answered and i > 0:  # the first warms the line up
                    rtts.append(time.perf_counter() - t0)
            out[name] = statistics.median(rtts) if rtts else float("nan")
        return out
