"""An engine's models while it runs: the start sequence that loads them (one at a time, to bound
peak memory), checks them against the policy and each other and wires them to the request tracker
and the input processor; the stop that ends them; and their health. Empty before `start()` and
after `close()`."""

from __future__ import annotations

from collections.abc import Callable

from ..engine import LoadedModel, Worker
from ..structured import GrammarCompiler
from .input_processor import InputProcessor
from .launch import Launcher
from .profiling import Profiling
from .request_tracker import RequestTracker
from .setup import EnginePlan, check_tokenizers
from .views import EngineHealth


class ServedModels:
    def __init__(self, plan: EnginePlan, launcher: Launcher, tracker: RequestTracker, profiling: Profiling):
        self.plan = plan
        self.launcher = launcher
        self.tracker = tracker
        self.profiling = profiling
        self.workers: dict[str, Worker] = {}
        self.loaded: dict[str, LoadedModel] = {}
        self.inputs: InputProcessor | None = None  # once the models are loaded
        self.stuck: list[str] = []  # workers the last stop() had to abandon

    async def start(self, in_flight: Callable[[], int]) -> None:
        """Load every model and start its worker, then profile them where something plans with
        profiles. On failure, whatever started is stopped again before the error propagates."""
        policy = self.plan.policy
        workers, loaded = await self.launcher.start()
        try:
            check_tokenizers(policy, loaded)
            entry = loaded[policy.entry_model]
            eos = frozenset().union(*(loaded[m].eos_token_ids for m in policy.models))
            grammars = GrammarCompiler(entry.tokenizer, entry.vocab_size, eos)
            policy.validate(dict(loaded))  # e.g. a learned router trained for another pair
            policy.use_in_flight(in_flight)
            self.workers, self.loaded = workers, loaded
            self.tracker.workers, self.tracker.tokenizer = workers, entry.tokenizer
            self.inputs = InputProcessor(entry, workers, policy.models, grammars, self.tracker.in_use)
            await self.profiling.at_start(workers, self.launcher)
        except BaseException:
            await self.launcher.stop(workers, self.plan.options.stop_timeout)
            self.loaded, self.workers = {}, {}
            raise

    async def stop(self) -> None:
        """Stop the workers within the engine's stop_timeout; requests waiting on a worker that
        did not stop end here (they would otherwise wait forever)."""
        stuck = await self.launcher.stop(self.workers, self.plan.options.stop_timeout)
        self.workers.clear()
        self.loaded.clear()
        self.inputs = None
        self.stuck = stuck
        if stuck:
            self.tracker.end_all(stuck[0], f"the engine closed while worker(s) {stuck} were stuck")

    def health(self, running: bool) -> EngineHealth:
        """Per worker "ok", "stopped", "stuck: ..." or the error that killed it."""
        workers = {}
        for name in self.plan.specs:
            worker = self.workers.get(name)
            if worker is None:
                workers[name] = "stuck: did not stop when closed" if name in self.stuck else "stopped"
            elif worker.alive:
                workers[name] = "ok"
            else:
                workers[name] = worker.error or "stopped"
        healthy = running and all(v == "ok" for v in workers.values())
        return EngineHealth(healthy=healthy, running=running, workers=workers)
