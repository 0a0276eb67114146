"""The caller's side of an engine with models in Ray actors: launching them, putting events
back in order, and what happens when an actor is lost.

**Launch.** Every model with a `placement` gets a `WorkerActor` (in one placement group when
the engine has a `placement_strategy`), the others a `LinkedWorker` in this process as usual;
each is told its peers (an actor's handle, or "in the caller's process"). Once all have loaded,
the hand-off delay between them is measured (half the median round trip through the envelope
path; `measure_links`).

**Events.** Each actor sends the caller a batch a step on a direct channel to this process's
`ChannelServer` (`channel.py`; by Ray `take` if it cannot connect), handed to its `RemoteWorker`.

**Order.** Each worker numbers the events it writes for a request, continuing from the number
the request brought when it arrived (`wire.NumberedEvent`), so the fleet delivers every
request's events to the engine in the order they were written, whichever actor's poll brings
them first; it follows each request's owner from the events' `handoff_to`.

**Loss.** An actor is lost when Ray says so (a poll fails with the actor dead), never because a
reply is slow. Then: its worker is marked dead (`health()` names it); the requests it owned, or
that are on their way to it, end with an error naming it; and every surviving worker is told:
it refuses hand-offs to the lost one from then on, frees its pending copies of the failed
requests, and reports what it owns (a census). A request that no survivor owns once all have
answered was lost in transit with the actor, and fails too. So nothing waits on a dead worker.
With three or more models a request moving between two survivors at that moment can be taken
for lost and fail as well (docs/distributed.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..config import EngineOptions, ModelSpec
from ..engine.model_core import ModelCore
from ..engine.outbox import WorkerEvent
from ..engine.sequence import Request
from ..engine.worker.cpu_turns import CoreShare
from ..engine.worker.protocol import Sink, WorkerSettings
from ..errors import ConfigError, InvalidRequestError
from ..policies.base import Policy
from . import ray_runtime, wire
from .channel import Channel, ChannelServer
from .linked_worker import LinkedWorker, owned_requests
from .links import PeerLink
from .remote_worker import RemoteWorker

log = logging.getLogger(__name__)

PING_ROUNDS = 20  # round trips per link measured at start
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory this tokenrouter is imported from


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
class Census:
    """Who still has to answer after `lost` went, what they own, and which requests it covers."""

    waiting: set[str]
    upto: int  # incarnations submitted before it started
    owned: set[str] = field(default_factory=set)


class Fleet:
    def __init__(
        self,
        specs: Mapping[str, ModelSpec],
        policy: Policy,
        options: EngineOptions,
        batch_min: Mapping[str, int],
        sink: Sink,
        in_flight: Callable[[], int],
        core_share: CoreShare | None,
    ):
        self.specs = dict(specs)
        self.policy = policy
        self.options = options
        self.batch_min = dict(batch_min)
        self.sink = sink  # the engine's: each call gets events in the order written
        self.in_flight = in_flight
        self.core_share = core_share
        self.engine_id = f"tokenrouter-{uuid.uuid4().hex[:8]}"
        self.secret = secrets.token_bytes(16)  # the hand-off channels' (channel.py)
        self.placed = [n for n, s in self.specs.items() if s.placement is not None]
        self.ray = None
        self.group = None  # the placement group this fleet made
        self.handles: dict[str, object] = {}
        self.workers: dict[str, object] = {}
        self.local: dict[str, LinkedWorker] = {}
        self.remote: dict[str, RemoteWorker] = {}
        self.tracks: dict[str, Track] = {}
        self.lost_workers: dict[str, str] = {}
        self.censuses: dict[str, Census] = {}
        self.closing = False
        self.server = None  # the channel server the actors send their events to
        self.link_rtt_s: dict[str, dict[str, float]] = {}  # measured at start: worker -> peer -> seconds
        self._incs = itertools.count(1)
        self._lock = threading.RLock()
        self._connected = False

    # ---- launch -----------------------------------------------------------------------------
    def launch(self) -> dict[str, object]:
        """Connect to Ray, create the actors and the in-process workers, and connect them all
        (blocking: call it off the event loop). The models load when the engine starts each."""
        self.ray = ray_runtime.acquire(self.options.ray_address)
        self._connected = True
        from .actor import ActorSettings, WorkerActor

        ray = self.ray
        self._check_feasible()
        strategy = self.options.placement_strategy
        if strategy is not None:
            from ray.util.placement_group import placement_group

            self.group = placement_group([self.specs[n].placement.bundle for n in self.placed], strategy=strategy)
            try:
                ray.get(self.group.ready(), timeout=60)
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(
                    f"placement_strategy: the cluster cannot hold {strategy} bundles "
                    f"{[self.specs[n].placement.bundle for n in self.placed]} (waited 60 s)"
                ) from None
        keep_kv = self.options.mode != "standard"
        for i, name in enumerate(self.placed):
            place = self.specs[name].placement
            threads = self.options.num_threads or max(1, round(place.num_cpus))
            loop = WorkerSettings(self.batch_min[name], self.options.batch_wait_s, threads)
            settings = ActorSettings(loop, keep_kv, self.engine_id, self.secret)
            opts = dict(place.actor_options(), runtime_env=self._runtime_env(place.runtime_env), max_restarts=0)
            opts["name"] = f"{self.engine_id}-{name}"
            if self.group is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=i
                )
            self.handles[name] = WorkerActor.options(**opts).remote(name, self.specs[name], self.policy, settings)
            self.remote[name] = RemoteWorker(
                name, self.specs[name], self.handles[name], self, f"{self.engine_id}/caller", self.batch_min[name]
            )
            self.remote[name].start()  # actors load at once, side by side: each has its own node's memory
        for name, spec in self.specs.items():
            if name in self.remote:
                continue
            core_share = self.core_share if spec.device.startswith("cpu") else None
            self.local[name] = LinkedWorker(
                ModelCore(name, spec, self.policy, keep_kv_on_handoff=keep_kv),
                self.local_sink,
                WorkerSettings(self.batch_min[name], self.options.batch_wait_s, self.options.num_threads),
                core_share=core_share,
            )
        self.workers = {name: self.remote.get(name) or self.local[name] for name in self.specs}
        names = list(self.handles)
        addresses = dict(zip(names, ray.get([self.handles[n].channel_address.remote() for n in names])))
        peers = {n: (self.handles[n], addresses[n]) if n in self.handles else None for n in self.specs}  # None: here
        self.server = ChannelServer(ray.util.get_node_ip_address(), self.secret, self._on_frame)  # the actors' events
        ray.get([h.connect.remote(peers, self.server.address) for h in self.handles.values()])
        for name, worker in self.local.items():
            worker.connect_peers(
                {
                    n: PeerLink(
                        n, self.handles[n], f"{self.engine_id}/{name}", self.leave, Channel(addresses[n], self.secret)
                    )
                    if n in self.handles
                    else w
                    for n, w in self.workers.items()
                }
            )
        return dict(self.workers)

    def _runtime_env(self, given: dict | None) -> dict:
        """The actor's runtime_env: the caller's, plus offline Hugging Face and this code first on
        PYTHONPATH (where the path does not exist, on another machine, it is skipped)."""
        env = dict(given or {})
        env_vars = dict(env.get("env_vars") or {})
        env_vars.setdefault("HF_HUB_OFFLINE", "1")
        env_vars.setdefault("TRANSFORMERS_VERBOSITY", "error")
        env_vars.setdefault("PYTHONPATH", PACKAGE_ROOT + os.pathsep + "${PYTHONPATH}")
        env["env_vars"] = env_vars
        return env

    def _check_feasible(self) -> None:
        """The cluster has the resources asked for (else an actor or the placement group would
        wait forever): each placed model's on some live node, and under STRICT_PACK all of them on
        one node, under STRICT_SPREAD each on a node of its own. Totals, not what is free now: a
        busy cluster is waited for."""
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        shown = [{k: v for k, v in n.items() if not k.startswith("node:")} for n in nodes]
        needs = {name: self.specs[name].placement.bundle for name in self.placed}
        for name, need in needs.items():
            if not any(_fits(need, node) for node in nodes):
                raise ConfigError(f"models[{name!r}].placement: no node of the Ray cluster has {need} (nodes: {shown})")
        strategy = self.options.placement_strategy
        if strategy == "STRICT_PACK":
            total: dict[str, float] = {}
            for need in needs.values():
                for k, v in need.items():
                    total[k] = total.get(k, 0.0) + v
            if not any(_fits(total, node) for node in nodes):
                raise ConfigError(f"placement_strategy: STRICT_PACK needs one node with {total} (nodes: {shown})")
        elif strategy == "STRICT_SPREAD" and not _spread(list(needs.values()), nodes):
            raise ConfigError(
                f"placement_strategy: STRICT_SPREAD needs a node of its own for each of {list(needs.values())} "
                f"(nodes: {shown})"
            )

    def measure_links(self) -> None:
        """Round trips: between actors through the envelope path, and from here to each actor.
        Each worker's hand-off delay is half its median round trip to its peers. Once every
        model has loaded (a loading thread holding the GIL would stretch them)."""
        ray = self.ray
        rtt: dict[str, dict[str, float]] = {name: {} for name in self.specs}
        pings = {name: h.ping_peers.remote(PING_ROUNDS) for name, h in self.handles.items()}
        for name, ref in pings.items():
            rtt[name].update(ray.get(ref))
        for name, handle in self.handles.items():
            ray.get(handle.ping.remote())
            samples = []
            for _ in range(PING_ROUNDS):
                t0 = time.perf_counter()
                ray.get(handle.ping.remote())
                samples.append(time.perf_counter() - t0)
            for local in self.local:  # a worker here and one in an actor
                rtt[local][name] = rtt[name][local] = statistics.median(samples)
            rtt.setdefault("caller", {})[name] = statistics.median(samples)
        self.link_rtt_s = rtt
        for name, worker in self.workers.items():
            worker.peer_rtt_s = {peer: v for peer, v in rtt.get(name, {}).items() if peer != name}
            peers = [v for peer, v in worker.peer_rtt_s.items() if peer in self.workers]
            worker.handoff_delay_s = statistics.mean(peers) / 2 if peers else 0.0  # over WorkerThread's 0

    # ---- requests ---------------------------------------------------------------------------
    def submitted(self, req: Request, entry: str) -> None:
        """The engine submits a request to model `entry`: follow it from here."""
        if req.grammar is not None:
            raise InvalidRequestError(
                "response_format",
                "constrained output is not supported yet with models in Ray actors (docs/distributed.md)",
            )
        with self._lock:
            self.tracks[req.request_id] = Track(
                req, next(self._incs), entry, local_next=0 if entry in self.local else None
            )

    def incarnation(self, request_id: str) -> int:
        with self._lock:
            track = self.tracks.get(request_id)
            return track.inc if track is not None else -1

    def leave(self, request_id: str) -> tuple[int, int]:
        """A request leaves this process for an actor: (its next event's number, its incarnation)."""
        with self._lock:
            track = self.tracks.get(request_id)
            if track is None:
                return 0, -1
            n = max(track.local_next or 0, track.expected)
            track.local_next = None
            return n, track.inc

    def local_sink(self, events: list[WorkerEvent]) -> None:
        """A worker in this process delivers a step's events: numbered, then in order."""
        with self._lock:
            out = []
            for ev in events:
                track = self.tracks.get(ev.request_id)
                if track is None:
                    continue
                n = track.local_next if track.local_next is not None else track.expected
                track.local_next = n + 1
                self._add(track, n, ev, out)
            self._deliver(out)

    def receive(self, name: str, batch: wire.EventBatch) -> None:
        """A poll's reply from worker `name`'s actor."""
        with self._lock:
            out = []
            for ne in batch.events:
                track = self.tracks.get(ne.event.request_id)
                if track is not None:
                    self._add(track, ne.n, ne.event, out)
            self._deliver(out)
            for item in batch.to_caller:
                self._to_local(item)
            for census in batch.census:
                self._census_reply(census.lost, name, census.owned)

    def _on_frame(self, data: bytes) -> None:
        """A batch on an actor's channel to this process."""
        batch = wire.loads(data)
        worker = self.remote.get(batch.source)
        if worker is not None:
            worker.on_batch(batch)

    def _add(self, track: Track, n: int, ev: WorkerEvent, out: list) -> None:
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
                if ev.handoff_to in self.lost_workers:
                    self._fail(track, self.workers[ev.handoff_to].error, out)
                    return

    def _deliver(self, out: list[WorkerEvent]) -> None:
        if out:
            self.sink(out)

    def _to_local(self, item: wire.ToCaller) -> None:
        """A hand-off or release from an actor for a worker in this process."""
        worker = self.local[item.target]
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
            self._fail(
                track,
                worker.error or f"worker {item.target!r} is not running",
                out,
                "error" if worker.error else "abort",
            )
            self._deliver(out)

    def _fail(self, track: Track, error: str | None, out: list, reason: str = "error") -> None:
        """End a request here with an error; the surviving workers free their copies of it."""
        rid = track.req.request_id
        self.tracks.pop(rid, None)
        out.append(WorkerEvent(rid, [], track.owner, finish_reason=reason, error=error))
        track.req.aborted = True
        for name, worker in self.workers.items():
            if name in self.lost_workers:
                continue
            if isinstance(worker, RemoteWorker):
                worker.abort_incarnation(rid, track.inc)
            else:
                worker.abort(rid)

    # ---- loss -------------------------------------------------------------------------------
    def lost(self, name: str, error: str) -> None:
        """Worker `name` is gone: its actor was lost, or its stepping thread died (`error` says
        which, naming it)."""
        with self._lock:
            if self.closing or name in self.lost_workers:
                return
            log.error("%s", error)
            self.lost_workers[name] = error
            self.remote[name].mark_lost(error)
            for worker in self.local.values():  # refuse hand-offs to it from now on
                peer = worker.peers.get(name)
                if isinstance(peer, PeerLink):
                    peer.lost(error)
            out: list[WorkerEvent] = []
            for track in [t for t in self.tracks.values() if t.owner == name]:
                self._fail(track, error, out)
            self._deliver(out)
            survivors = [n for n, w in self.workers.items() if n not in self.lost_workers and w.alive]
            census = self.censuses[name] = Census(
                set(survivors), upto=max((t.inc for t in self.tracks.values()), default=0)
            )
            for n in survivors:
                worker = self.workers[n]
                if isinstance(worker, RemoteWorker):
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
        with self._lock:
            self._census_reply(lost, worker, owned)

    def _census_reply(self, lost: str, worker: str, owned: list[str]) -> None:
        census = self.censuses.get(lost)
        if census is None or worker not in census.waiting:
            return
        census.waiting.discard(worker)
        census.owned.update(owned)
        if not census.waiting:
            self._census_done(lost)

    def _census_done(self, lost: str) -> None:
        census = self.censuses.pop(lost)
        error = self.lost_workers[lost]
        out: list[WorkerEvent] = []
        for track in [t for t in self.tracks.values() if t.inc <= census.upto and t.req.request_id not in census.owned]:
            self._fail(track, f"{error} (the request was lost in transit)", out)
        self._deliver(out)

    def use_profiles(self, profiles: dict) -> None:
        """Each actor's copy of the policy gets the latency profiles the engine's copy got."""
        futures = [w.call(_UseProfiles(profiles)) for w in self.remote.values() if w.alive]
        for f in futures:
            f.result()

    # ---- close ------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Kill the actors and remove the placement group this fleet made; let go of Ray.
        The engine has stopped the workers (and waited for them) first."""
        with self._lock:
            self.closing = True
        if not self._connected:
            return
        ray = self.ray
        for name, handle in self.handles.items():
            try:
                ray.kill(handle, no_restart=True)
            except Exception as e:  # already gone
                log.debug("killing the actor of %r: %s", name, e)
        for worker in self.remote.values():
            worker.join(timeout)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.group)
            except Exception as e:
                log.warning("removing the placement group: %s", e)
            self.group = None
        for worker in self.local.values():
            for link in worker.links:
                link.link.close()
        if self.server is not None:
            self.server.close()
            self.server = None
        self.handles.clear()
        self._connected = False
        ray_runtime.release()


def _fits(need: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in need.items())


def _spread(needs: list[dict], nodes: list[dict]) -> bool:
    """Whether each need can have a node of its own (a small matching, by backtracking)."""
    if not needs:
        return True
    first, rest = needs[0], needs[1:]
    return any(_fits(first, node) and _spread(rest, nodes[:i] + nodes[i + 1 :]) for i, node in enumerate(nodes))


class _UseProfiles:
    """`policy.use_profiles(profiles)` on a core's policy (the copy in an actor)."""

    def __init__(self, profiles: dict):
        self.profiles = profiles

    def __call__(self, core) -> None:
        core.policy.use_profiles(self.profiles)
