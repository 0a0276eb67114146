"""The workers of an engine, for its mode: the one place that branches on it.

- "routed" (the engine): a `WorkerThread` per model, each stepping on its own; models placed in
  Ray actors get a `RemoteWorker` instead (`distributed.Fleet`).
- "standard" (a baseline): the same workers, but a hand-off frees its KV and goes back to the
  caller, who re-sends the whole sequence (re-prefill).
- "lockstep" (a baseline): one `LockstepDriver` thread steps every model's batch in turn.

On CPU, workers in this process take turns on the cores (`engine/worker/cpu_turns.py`) unless
`num_threads` fixes each one's threads. Models load one at a time, to bound peak memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import anyio
import torch

from ..engine import (
    CoreShare,
    LoadedModel,
    LockstepDriver,
    ModelCore,
    Sink,
    Worker,
    WorkerSettings,
    WorkerThread,
    usable_cores,
)
from .setup import EnginePlan

log = logging.getLogger(__name__)


class Launcher:
    def __init__(self, plan: EnginePlan, sink: Sink, in_flight: Callable[[], int]):
        self.plan = plan
        self.sink = sink  # where every worker delivers its steps' events
        self.in_flight = in_flight  # requests not yet ended (the actors' copies of the policy plan with it)
        self.share: CoreShare | None = None  # workers on CPU: their turns and compute thread
        self.fleet = None  # with placed models: the actors and the order of their events (distributed/)

    @property
    def mode(self) -> str:
        return self.plan.options.mode

    async def start(self) -> tuple[dict[str, Worker], dict[str, LoadedModel]]:
        """Make the workers, load every model in its worker's thread, and start them stepping.
        On failure, whatever started is stopped again before the error propagates."""
        self.share = self.core_share()
        if self.share is not None:
            self.share.start()
        wake = threading.Event() if self.mode == "lockstep" else None  # one driver hears every worker
        loaded: dict[str, LoadedModel] = {}
        workers: dict[str, Worker] = {}
        try:
            workers = await self.make_workers(wake)
            if self.mode == "lockstep":
                LockstepDriver(list(workers.values()), wake).start()
            for name, worker in workers.items():
                if self.mode != "lockstep":
                    worker.start()
                loaded[name] = await anyio.to_thread.run_sync(worker.wait_ready)
            if self.fleet is not None:  # the transport between workers in other processes, once all loaded
                await anyio.to_thread.run_sync(self.fleet.measure_links)
        except BaseException:
            for worker in workers.values():
                worker.stop()
            await self.stop_rest(self.plan.options.stop_timeout)
            raise
        return workers, loaded

    async def make_workers(self, wake: threading.Event | None) -> dict[str, Worker]:
        plan = self.plan
        if plan.placed:  # some models in Ray actors (distributed/)
            from ..distributed import Fleet

            self.fleet = Fleet(
                plan.specs, plan.policy, plan.options, plan.batch_min, self.sink, self.in_flight, self.share
            )
            return await anyio.to_thread.run_sync(self.fleet.launch)
        workers = {}
        for name, spec in plan.specs.items():
            core = ModelCore(name, spec, plan.policy, keep_kv_on_handoff=self.mode != "standard")
            settings = WorkerSettings(plan.batch_min[name], plan.options.batch_wait_s, plan.options.num_threads)
            share = self.share if torch.device(spec.device).type == "cpu" else None
            workers[name] = WorkerThread(core, self.sink, settings, core_share=share, wake=wake)
        for worker in workers.values():
            worker.connect(workers)
        return workers

    def core_share(self) -> CoreShare | None:
        """Without `num_threads`, workers on CPU take turns, each step alone on every core (those
        in this process: a worker in a Ray actor has its own)."""
        specs = self.plan.specs.values()
        on_cpu = sum(torch.device(s.device).type == "cpu" and s.placement is None for s in specs)
        if self.plan.options.num_threads is not None or self.mode == "lockstep" or on_cpu < 2:
            return None
        return CoreShare(usable_cores())

    def before_submit(self, req, model: str) -> None:
        """The fleet follows every request that may visit an actor (it may refuse one)."""
        if self.fleet is not None:
            self.fleet.submitted(req, model)

    async def share_profiles(self, profiles: dict) -> None:
        """The actors' copies of the policy plan with the same latency profiles as the caller's."""
        if self.fleet is not None:
            await anyio.to_thread.run_sync(self.fleet.use_profiles, profiles)

    async def stop(self, workers: dict[str, Worker], timeout: float) -> list[str]:
        """Stop the workers within one deadline for all; the names of those that did not stop."""
        for worker in workers.values():
            worker.stop()
        stuck = []
        deadline = time.monotonic() + timeout  # exit never waits longer
        for name, worker in workers.items():
            left = max(0.0, deadline - time.monotonic())
            if not await anyio.to_thread.run_sync(worker.join, left):
                stuck.append(name)
        await self.stop_rest(max(0.0, deadline - time.monotonic()))
        if stuck:
            log.error("worker(s) %s did not stop within %.1f s and were abandoned", stuck, timeout)
        return stuck

    async def stop_rest(self, timeout: float) -> None:
        """The CPU turns' compute thread, and the fleet's actors (and the cluster it started)."""
        if self.share is not None:
            self.share.stop(timeout)
            self.share = None
        if self.fleet is not None:
            fleet, self.fleet = self.fleet, None
            await anyio.to_thread.run_sync(fleet.close, max(1.0, timeout))
