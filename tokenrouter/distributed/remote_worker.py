"""The caller's handle on a worker in a Ray actor: what the `Engine` uses of a `WorkerThread`.

`submit`, `abort`, `release`, `hand_off` (the standard-serving baseline resends through the
caller) and `stop` go to the actor as envelopes at once; `call`, `reset_prefix_cache`, `stats`,
`routing_counters` and `set_batch_min` are Ray calls. The worker's events (and hand-offs for workers
in this process, census answers) come a batch a step on the actor's channel to the fleet, which
hands them here (`on_batch`); a pump thread keeps one `take` open, whose reply carries what the
channel could not, and whether the worker lives. A `take` that fails
because the actor died is how the loss is seen: no timeout of ours decides it, so a slow
network only delays the replies. The loss goes to the fleet, which fails what was there.

What it uses of the fleet is `FleetHooks` (the `Fleet` is one), so the fleet's modules import
this one and not the reverse.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from ..config import ModelSpec
from ..engine import LoadedModel, Request, WorkerStats
from ..errors import ConfigError, ModelLoadError
from . import wire
from .links import CallerLink

log = logging.getLogger(__name__)

TAKE_WAIT_S = 1.0  # a poll with nothing to report returns after this long (and says whether the worker lives)
STATS_TIMEOUT_S = 30.0  # a statistics call that gets no answer returns the last ones seen


class FleetHooks(Protocol):
    """What a `RemoteWorker` asks of the fleet that made it, and tells it."""

    in_flight: Callable[[], int]  # the engine's requests not yet ended (every poll carries it)

    def incarnation(self, request_id: str) -> int: ...  # -1: not followed
    def leave(self, request_id: str) -> tuple[int, int]: ...  # (its next event's number, its incarnation)
    def lost(self, name: str, error: str) -> None: ...  # the worker is gone (`error` names it)
    def receive(self, name: str, batch: wire.EventBatch) -> None: ...  # a batch from its actor


class RemoteWorker:
    takes_turns = False  # workers in actors never take turns on the caller's cores

    def __init__(self, name: str, spec: ModelSpec, handle, fleet: FleetHooks, ray, sender: str, batch_min: int):
        self.name = name
        self.spec = spec
        self.handle = handle
        self.fleet = fleet
        self.ray = ray  # the module, connected
        self.batch_min = max(1, min(batch_min, spec.max_num_seqs))
        self.link = CallerLink(handle, sender)
        self.error: str | None = None
        self.stopping = False
        self.lost = False
        self.facts = None  # ModelFacts, once loaded
        self.host: str | None = None
        self.handoff_delay_s = 0.0  # measured by the fleet at start (half a round trip to the peers)
        self.peer_rtt_s: dict[str, float] = {}  # those round trips, per peer (and "caller")
        self.last_stats: WorkerStats | None = None
        self._thread_alive = True  # the actor's stepping thread, as the last poll said
        self._ready_ref = None
        self._pump: threading.Thread | None = None
        self._stopped = threading.Event()

    # ---- set-up ----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin loading (the fleet starts every actor's at launch; the engine's call is then a no-op)."""
        if self._ready_ref is None:
            self._ready_ref = self.handle.load.remote()

    def wait_ready(self) -> LoadedModel:
        """Block until the actor has loaded its model; raise its error (as ModelLoadError or
        ConfigError, naming the model) if it could not."""
        ray = self.ray
        try:
            facts = ray.get(self._ready_ref)
        except ray.exceptions.RayError as e:
            self.lost = True
            raise ModelLoadError(f"model {self.name!r}: its Ray actor failed while loading: {_short(e)}") from None
        if isinstance(facts, wire.LoadFailure):
            error = ConfigError if facts.kind == "ConfigError" else ModelLoadError
            raise error(f"model {self.name!r} (in its Ray actor): {facts.message}")
        self.facts = facts
        self.host = facts.host
        self.last_stats = ray.get(
            self.handle.stats.remote()
        )  # what stats() says if the actor is lost before it is asked
        self._pump = threading.Thread(target=self._poll, name=f"tokenrouter-ray-pump-{self.name}", daemon=True)
        self._pump.start()
        return facts.loaded(self.spec)

    @property
    def load_failed(self) -> bool:
        return self.facts is None and self._ready_ref is not None

    # ---- what the engine sends --------------------------------------------------------------
    def submit(self, req: Request) -> bool:
        if not self.alive:
            return False
        self.link.send([wire.ForIncarnation(wire.Submit(req), self.fleet.incarnation(req.request_id))])
        return True

    def hand_off(self, msg, req: Request) -> bool:
        """A hand-off sent through the caller (the standard-serving baseline re-sends this way)."""
        if not self.alive:
            return False
        event_seq, inc = self.fleet.leave(req.request_id)
        self.link.send([wire.ForIncarnation(wire.HandOff(msg, req), inc, event_seq)])
        return True

    def abort(self, request_id: str) -> None:
        self.abort_incarnation(request_id, self.fleet.incarnation(request_id))

    def abort_incarnation(self, request_id: str, inc: int) -> None:
        if not self.lost:
            self.link.send([wire.ForIncarnation(wire.Abort(request_id), inc)])

    def release(self, request_id: str) -> None:
        if not self.lost:
            self.link.send([wire.Release(request_id)])

    def peer_lost(self, name: str, error: str) -> None:
        """Tell the actor a peer is gone; it answers with a census in a later poll."""
        self.link.send([wire.PeerLost(name, error)])

    def stop(self) -> None:
        self.stopping = True
        if not self.lost:
            self.link.send([wire.Stop()])

    def set_batch_min(self, b: int) -> None:
        self.batch_min = max(1, min(int(b), self.spec.max_num_seqs))
        if not self.lost:
            self.handle.set_batch_min.remote(self.batch_min)

    def call(self, fn) -> Future:
        """`fn(core)` in the actor's stepping thread between steps; `fn` travels by cloudpickle."""
        if self.lost or not self._thread_alive:
            future: Future = Future()
            future.set_exception(RuntimeError(f"worker {self.name!r} is not running: {self.error or 'stopped'}"))
            return future
        return self.handle.call.remote(fn).future()

    def reset_prefix_cache(self) -> Future:
        return self.call(_forget_free_prefixes)

    def inspect(self, fn):
        """`fn(worker)` in the actor now, outside its stepping thread (tests, debugging): its result."""
        return self.ray.get(self.handle.inspect.remote(fn))

    def routing_counters(self) -> dict:
        return self.ray.get(self.handle.routing_counters.remote())

    # ---- state ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.facts is not None and not self.lost and self._thread_alive and not self._stopped.is_set()

    @property
    def capacity_tokens(self) -> int:
        return self.facts.capacity_tokens

    @property
    def torch_threads(self) -> int | None:
        return self.facts.torch_threads if self.facts is not None else None

    def join(self, timeout: float | None = None) -> bool:
        """Whether the worker has stopped (its last events delivered) within `timeout`."""
        if self._pump is None:
            return True
        return self._stopped.wait(timeout)

    def stats(self) -> WorkerStats:
        """The actor's statistics now; once it is gone, the last ones seen."""
        if self.alive:
            ray = self.ray
            try:
                self.last_stats = ray.get(self.handle.stats.remote(), timeout=STATS_TIMEOUT_S)
            except ray.exceptions.RayError as e:
                log.warning("worker %r: no statistics: %s", self.name, _short(e))
        if self.last_stats is None:
            raise RuntimeError(f"worker {self.name!r} has no statistics: it never loaded")
        if not self.alive:
            self.last_stats.alive, self.last_stats.error = False, self.error
        return self.last_stats

    # ---- the pump ---------------------------------------------------------------------------
    def _poll(self) -> None:
        ray = self.ray
        try:
            while True:
                try:
                    batch = wire.loads(ray.get(self.handle.take.remote(self.fleet.in_flight(), TAKE_WAIT_S)))
                except ray.exceptions.ActorUnavailableError:  # a connection lost for now, not the actor
                    self._stopped.wait(0.1)
                    continue
                except ray.exceptions.RayActorError as e:
                    self.lost = True
                    self.fleet.lost(self.name, f"worker {self.name!r} died: its Ray actor was lost ({_short(e)})")
                    return
                except Exception as e:  # Ray itself is going away
                    self.lost = True
                    self.fleet.lost(
                        self.name, f"worker {self.name!r} died: its Ray actor is out of reach ({_short(e)})"
                    )
                    return
                self.on_batch(batch)
                if self._stopped.is_set():
                    return
        finally:
            self._stopped.set()

    def on_batch(self, batch) -> None:
        """A batch from the actor, by its channel (`Fleet`'s server) or by a take (the pump)."""
        if not batch.stopped and self._stopped.is_set():
            self.fleet.receive(self.name, batch)  # a request refused after the stop: its end
            return
        self._thread_alive = self._thread_alive and batch.alive  # a take made before it went down says nothing new
        if batch.error is not None:
            self.error = batch.error
        if batch.stats is not None:
            self.last_stats = batch.stats
        self.fleet.receive(self.name, batch)
        if batch.stopped:
            self._stopped.set()
            if not self.stopping:  # its stepping thread died: for its peers, as good as lost
                self.fleet.lost(self.name, self.error or f"worker {self.name!r} stopped")

    def mark_lost(self, error: str) -> None:
        self.lost = True
        if self.error is None:
            self.error = error


def _forget_free_prefixes(core) -> int:
    return core.blocks.forget_free_prefixes()


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
