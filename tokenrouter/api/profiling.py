"""An engine's step-latency profiles, and what plans with them: the throughput model of
delayed_batching="auto" (autobatch/controller.py), and a policy that asks for them
(`wants_profiles`, e.g. Speculative(k="auto"))."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import anyio

from ..autobatch import AutoBatching, LatencyProfile, ThroughputPrediction, profile_workers
from ..engine import LoadedModel, Worker
from .launch import Launcher
from .setup import EnginePlan

log = logging.getLogger(__name__)


class Profiling:
    def __init__(
        self,
        plan: EnginePlan,
        in_flight: Callable[[], int],
        workers: Callable[[], Mapping[str, Worker]],
        loaded: Callable[[], Mapping[str, LoadedModel]],
    ):
        self.policy = plan.policy
        self.num_models = len(plan.specs)
        self.profiles: dict[str, LatencyProfile] = {}
        self.auto: AutoBatching | None = None
        if plan.auto_batching:
            self.auto = AutoBatching(
                policy=plan.policy,
                specs=plan.specs,
                batch_wait_s=plan.options.batch_wait_s,
                options=plan.options.auto_batching_options,
                workers=workers,
                loaded=loaded,
                profiles=lambda: self.profiles,
                in_flight=in_flight,
            )

    def count_inflight(self) -> None:
        """A request started or ended: the throughput model integrates the load over time."""
        if self.auto is not None:
            self.auto.count_inflight()

    async def measure(self, workers: Mapping[str, Worker], refresh: bool = False) -> dict[str, LatencyProfile]:
        """Each model's profile, from the cache or measured in its worker's thread (`profile_workers`)."""
        out = await profile_workers(workers, refresh)
        self.profiles.update(out)
        return out

    async def at_start(self, workers: Mapping[str, Worker], launcher: Launcher) -> None:
        """Profile the models (or read their cached profiles) where the throughput model or the
        policy plans with them; serve anyway if that fails: B = 1, the policy on its defaults."""
        if self.auto is None and not self.policy.wants_profiles:
            return
        try:
            await self.measure(workers)
        except Exception as e:
            log.error("profiling the models failed: %s", e)
            if self.auto is not None:
                self.auto.profiling_failed(e)
        if self.policy.wants_profiles and len(self.profiles) == self.num_models:
            self.policy.use_profiles(dict(self.profiles))
            await launcher.share_profiles(dict(self.profiles))

    def start(self) -> None:
        """The throughput model starts re-picking B (only with every model's profile)."""
        if self.auto is not None:
            self.auto.start()

    async def stop(self) -> None:
        if self.auto is not None and self.auto.running:
            await anyio.to_thread.run_sync(self.auto.stop)

    def prediction(self, retune: bool = False) -> ThroughputPrediction | None:
        """The throughput model's current choice and prediction, re-picked first with `retune`
        (only once every model has a profile); None without delayed_batching="auto"."""
        if self.auto is None:
            return None
        if retune and self.profiles:
            self.auto.retune()
        return self.auto.prediction
