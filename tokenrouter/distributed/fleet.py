"""The caller's side of an engine with models in Ray actors: the actors and workers it launches,
and the hub their events and losses pass through.

**Launch.** Every model with a `placement` gets a `WorkerActor` (in one placement group when
the engine has a `placement_strategy`; checked against the cluster first, `placement.py`), the
others a `LinkedWorker` in this process as usual; each is told its peers (an actor's handle, or
"in the caller's process"). Once all have loaded, the hand-off delay between them is measured
(`link_timing.py`).

**Events.** Each actor sends the caller a batch a step on a direct channel to this process's
`ChannelServer` (`channel.py`; by Ray `take` if it cannot connect), handed to its `RemoteWorker`,
which passes it back here (`receive`): its events go to the engine in each request's order
(`order.py`), its census answers to the loss handling (`losses.py`). The fleet is what each
`RemoteWorker` reports to (`remote_worker.FleetHooks`).
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable, Mapping

from ..config import EngineOptions, ModelSpec
from ..engine import CoreShare, ModelCore, Request, Sink, WorkerSettings
from ..errors import ConfigError, InvalidRequestError
from ..policies import Policy
from . import ray_runtime, wire
from .channel import Channel, ChannelServer
from .link_timing import measure_links
from .linked_worker import LinkedWorker
from .links import PeerLink
from .losses import Losses
from .order import RequestOrder, Roster
from .placement import check_feasible, runtime_env
from .remote_worker import RemoteWorker

log = logging.getLogger(__name__)


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
        self.in_flight = in_flight
        self.core_share = core_share
        self.engine_id = f"tokenrouter-{uuid.uuid4().hex[:8]}"
        self.secret = secrets.token_bytes(16)  # the hand-off channels' (channel.py)
        self.placed = [n for n, s in self.specs.items() if s.placement is not None]
        self.ray = None
        self.group = None  # the placement group this fleet made
        self.handles: dict[str, object] = {}
        self.roster = Roster()
        self.order = RequestOrder(self.roster, sink)  # sink: the engine's, each call in the order written
        self.losses = Losses(self.order)
        self.server = None  # the channel server the actors send their events to
        self.link_rtt_s: dict[str, dict[str, float]] = {}  # measured at start: worker -> peer -> seconds
        self._connected = False

    # ---- launch -----------------------------------------------------------------------------
    def launch(self) -> dict[str, object]:
        """Connect to Ray, create the actors and the in-process workers, and connect them all
        (blocking: call it off the event loop). The models load when the engine starts each."""
        self.ray = ray_runtime.acquire(self.options.ray_address)
        self._connected = True
        from .actor import ActorSettings, WorkerActor

        ray, roster = self.ray, self.roster
        strategy = self.options.placement_strategy
        check_feasible(ray, self.specs, self.placed, strategy)
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
            opts = dict(place.actor_options(), runtime_env=runtime_env(place.runtime_env), max_restarts=0)
            opts["name"] = f"{self.engine_id}-{name}"
            if self.group is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=i
                )
            self.handles[name] = WorkerActor.options(**opts).remote(name, self.specs[name], self.policy, settings)
            roster.remote[name] = RemoteWorker(
                name,
                self.specs[name],
                self.handles[name],
                self,
                ray,
                f"{self.engine_id}/caller",
                self.batch_min[name],
            )
            roster.remote[name].start()  # actors load at once, side by side: each has its own node's memory
        for name, spec in self.specs.items():
            if name in roster.remote:
                continue
            core_share = self.core_share if spec.device.startswith("cpu") else None
            roster.local[name] = LinkedWorker(
                ModelCore(name, spec, self.policy, keep_kv_on_handoff=keep_kv),
                self.order.local_sink,
                WorkerSettings(self.batch_min[name], self.options.batch_wait_s, self.options.num_threads),
                core_share=core_share,
            )
        roster.workers.update({name: roster.remote.get(name) or roster.local[name] for name in self.specs})
        names = list(self.handles)
        addresses = dict(zip(names, ray.get([self.handles[n].channel_address.remote() for n in names])))
        peers = {n: (self.handles[n], addresses[n]) if n in self.handles else None for n in self.specs}  # None: here
        self.server = ChannelServer(ray.util.get_node_ip_address(), self.secret, self._on_frame)  # the actors' events
        ray.get([h.connect.remote(peers, self.server.address) for h in self.handles.values()])
        for name, worker in roster.local.items():
            worker.connect_peers(
                {
                    n: PeerLink(
                        n, self.handles[n], f"{self.engine_id}/{name}", self.leave, Channel(addresses[n], self.secret)
                    )
                    if n in self.handles
                    else w
                    for n, w in roster.workers.items()
                }
            )
        return dict(roster.workers)

    def measure_links(self) -> None:
        """Each worker's hand-off delay, from round trips through the envelope path (`link_timing.py`)."""
        self.link_rtt_s = measure_links(self.ray, self.handles, self.roster.local, self.roster.workers)

    # ---- requests ---------------------------------------------------------------------------
    def submitted(self, req: Request, entry: str) -> None:
        """The engine submits a request to model `entry`: follow it from here."""
        if req.grammar is not None:
            raise InvalidRequestError(
                "response_format",
                "constrained output is not supported yet with models in Ray actors (docs/distributed.md)",
            )
        self.order.follow(req, entry)

    # ---- what each RemoteWorker reports (remote_worker.FleetHooks) ---------------------------
    def incarnation(self, request_id: str) -> int:
        return self.order.incarnation(request_id)

    def leave(self, request_id: str) -> tuple[int, int]:
        """A request leaves this process for an actor: (its next event's number, its incarnation)."""
        return self.order.leave(request_id)

    def lost(self, name: str, error: str) -> None:
        self.losses.lost(name, error)

    def receive(self, name: str, batch: wire.EventBatch) -> None:
        """A batch from worker `name`'s actor: its events, hand-offs to workers here, census answers."""
        with self.order.lock:
            self.order.remote_events(batch.events)
            for item in batch.to_caller:
                self.order.to_local(item)
            for census in batch.census:
                self.losses.census_reply(census.lost, name, census.owned)

    def _on_frame(self, data: bytes) -> None:
        """A batch on an actor's channel to this process."""
        batch = wire.loads(data)
        worker = self.roster.remote.get(batch.source)
        if worker is not None:
            worker.on_batch(batch)

    def use_profiles(self, profiles: dict) -> None:
        """Each actor's copy of the policy gets the latency profiles the engine's copy got."""
        futures = [w.call(_UseProfiles(profiles)) for w in self.roster.remote.values() if w.alive]
        for f in futures:
            f.result()

    # ---- close ------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Kill the actors and remove the placement group this fleet made; let go of Ray.
        The engine has stopped the workers (and waited for them) first."""
        with self.order.lock:
            self.losses.closing = True
        if not self._connected:
            return
        ray = self.ray
        for name, handle in self.handles.items():
            try:
                ray.kill(handle, no_restart=True)
            except Exception as e:  # already gone
                log.debug("killing the actor of %r: %s", name, e)
        for worker in self.roster.remote.values():
            worker.join(timeout)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.group)
            except Exception as e:
                log.warning("removing the placement group: %s", e)
            self.group = None
        for worker in self.roster.local.values():
            for link in worker.links:
                link.link.close()
        if self.server is not None:
            self.server.close()
            self.server = None
        self.handles.clear()
        self._connected = False
        ray_runtime.release()


class _UseProfiles:
    """`policy.use_profiles(profiles)` on a core's policy (the copy in an actor)."""

    def __init__(self, profiles: dict):
        self.profiles = profiles

    def __call__(self, core) -> None:
        core.policy.use_profiles(self.profiles)
