"""delayed_batching="auto": the controller that picks B, each worker's delayed-batching size.

Why it exists: the best B depends on the routing the workers actually see (how often each model
hands off, how many of its tokens are kept, how long catch-ups are) and on how many requests are
in flight, and both drift with the traffic. So a thread watches the workers' routing counters
and the requests in flight, decays what it saw (recent traffic weighs most), and every
`AutoBatchingOptions.interval_s` re-picks B per model with the throughput model in
`autobatch/throughput_model.py` (`choose_b`) from each model's step-latency profile
(`autobatch/latency_profile.py`), then sets it on the workers. B stays 1 until it has seen enough
tokens. The `Engine` builds one for `delayed_batching="auto"` and only delegates to it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import anyio

from ..engine import usable_cores
from . import latency_profile
from .latency_models import TableLatency
from .latency_profile import LatencyProfile
from .throughput_model import RoutingStats, ThroughputPrediction, choose_b

if TYPE_CHECKING:
    from ..config import AutoBatchingOptions, ModelSpec
    from ..engine import LoadedModel, Worker
    from ..policies import Policy

log = logging.getLogger(__name__)


async def profile_workers(workers: Mapping[str, Worker], refresh: bool = False) -> dict[str, LatencyProfile]:
    """Each worker's step-latency profile: from the cache under the store home, else measured now in
    the worker's own thread, between its steps, one model at a time, and cached."""
    out: dict[str, LatencyProfile] = {}
    for name, worker in workers.items():
        # asked of the worker, which may be in another process (a Ray actor: distributed/)
        info = await anyio.to_thread.run_sync(worker.call(lambda core: latency_profile.profile_info(core)).result)
        prof = None if refresh else latency_profile.load_cached(info)
        if prof is None:
            future = worker.call(lambda core: latency_profile.measure(core))  # looked up now: tests swap it
            prof = await anyio.to_thread.run_sync(future.result)
            try:
                if not prof.disorder:  # measured on a busy machine: good for now, not for later runs
                    latency_profile.save(prof)
            except OSError as e:
                log.warning("could not cache the latency profile of %r: %s", name, e)
        out[name] = prof
    return out


class AutoBatching:
    """Re-picks B per model from the profiles and the routing observed lately.

    `start()` after the workers (and profiles) are up; `stop()` before the workers stop;
    `count_inflight()` whenever a request starts or ends; `retune()` re-picks now (any thread);
    `prediction` is the current choice and what it predicts.
    """

    MIN_OBSERVED_TOKENS = 32  # sampled tokens on the entry model (decayed) before B may leave 1
    # Observations decay: the routing a while ago counts less. The half-life must hold enough
    # tokens at CPU speeds too: at 2 tokens/s, 30 s keep ~90 (decayed), above the minimum.
    _OBS_HALF_LIFE_S = 30.0
    _MAX_MODEL_CONCURRENCY = 128  # the chain has C + 1 states; one choice of B costs ~0.4 s at 128

    def __init__(
        self,
        *,
        policy: Policy,
        specs: Mapping[str, ModelSpec],
        batch_wait_s: float,
        options: AutoBatchingOptions,
        workers: Callable[[], Mapping[str, Worker]],
        loaded: Callable[[], Mapping[str, LoadedModel]],
        profiles: Callable[[], Mapping[str, LatencyProfile]],
        in_flight: Callable[[], int],
    ):
        self.policy = policy
        self.specs = specs
        self.batch_wait_s = batch_wait_s
        self.options = options
        self._workers = workers
        self._loaded = loaded
        self._profiles = profiles
        self._in_flight = in_flight
        self._prediction: ThroughputPrediction | None = None
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen: dict = {}  # counters at the last look, per model (and _BUSY)
        self._obs: dict = {}  # decayed sums of what happened since
        self._time = 0.0
        self._inputs: tuple | None = None
        self._concurrency = 0
        # requests in flight, integrated over the time any are (the concurrency the model assumes)
        self._inflight_lock = threading.Lock()
        self._inflight = [0, time.monotonic(), 0.0, 0.0]  # count, since, count x seconds, busy seconds

    @property
    def prediction(self) -> ThroughputPrediction | None:
        return self._prediction

    @property
    def running(self) -> bool:
        return self.thread is not None

    # ---- lifecycle -------------------------------------------------------------------------
    def profiling_failed(self, e: Exception) -> None:
        """Profiling at start failed: the engine serves anyway, with B = 1."""
        log.error("delayed_batching='auto': profiling failed, B stays 1: %s", e)
        self._prediction = self._no_prediction(f"profiling failed: {type(e).__name__}: {e}")

    def start(self) -> None:
        """Start re-picking B, from fresh observations; nothing to do without every model's profile."""
        if len(self._profiles()) != len(self._workers()):
            return
        self._prediction = self._no_prediction("collecting observations: B = 1")
        self._seen, self._obs, self._inputs = {}, {}, None  # fresh workers count from 0
        with self._inflight_lock:
            self._inflight = [self._in_flight(), time.monotonic(), 0.0, 0.0]
        self._stop.clear()
        self._time = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="tokenrouter-auto-batching", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and join it (blocks: call it from a worker thread in async code)."""
        if self.thread is None:
            return
        self._stop.set()
        self.thread.join(timeout)
        self.thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            try:
                self.retune()
            except Exception:
                log.exception("delayed_batching='auto': re-picking B failed")

    # ---- observing -------------------------------------------------------------------------
    def count_inflight(self) -> None:
        """A request started or ended (or the tuner looks): integrate the count up to now."""
        with self._inflight_lock:
            count, since, area, busy = self._inflight
            now = time.monotonic()
            if count:
                area += count * (now - since)
                busy += now - since
            self._inflight = [self._in_flight(), now, area, busy]

    def _observe(self, names: list[str]) -> dict:
        """Decayed sums of each model's counters (what happened lately weighs most), and of the
        requests in flight over the time any were (key BUSY: area = count x seconds, seconds)."""
        now = time.monotonic()
        decay = 0.5 ** ((now - self._time) / self._OBS_HALF_LIFE_S)
        self._time = now
        self.count_inflight()
        workers = self._workers()
        sources = {m: workers[m].routing_counters for m in names}
        sources[_BUSY] = lambda: {"area": self._inflight[2], "seconds": self._inflight[3]}
        for m, read in sources.items():
            counters = read()
            seen = self._seen.get(m, {})
            obs = self._obs.setdefault(m, {})
            for key, value in counters.items():
                if isinstance(value, dict):  # a histogram: decay each bin
                    was, hist = seen.get(key, {}), obs.setdefault(key, {})
                    for k in hist.keys() | value.keys():
                        hist[k] = hist.get(k, 0.0) * decay + (value.get(k, 0) - was.get(k, 0))
                else:
                    obs[key] = obs.get(key, 0.0) * decay + (value - seen.get(key, 0))
            self._seen[m] = counters
        return self._obs

    # ---- choosing B ------------------------------------------------------------------------
    def _no_prediction(self, note: str) -> ThroughputPrediction:
        return ThroughputPrediction(
            batch_min={name: w.batch_min for name, w in self._workers().items()},
            tokens_per_s=None,
            per_token_latency_s=None,
            concurrency=self._concurrency,
            batch_wait_s=self.batch_wait_s,
            note=note,
        )

    def _shared_device(self, names: list[str]) -> float:
        shared = self.options.shared_device
        if shared is not None:
            return min(1.0, max(0.0, float(shared)))
        loaded = self._loaded()
        workers = self._workers()
        devices = {str(loaded[m].device) for m in names}
        if len(devices) > 1 or len({workers[m].host for m in names}) > 1:  # other devices, or other machines
            return 0.0
        if next(iter(devices)).startswith("cpu"):
            cores = usable_cores()
            threads = sum(workers[m].torch_threads or 1 for m in names)
            return min(1.0, max(0.0, threads / cores - 1.0))
        return 1.0

    def retune(self) -> None:
        """Re-pick B per model from the profiles and the routing observed lately (any thread)."""
        with self._lock:
            workers, profiles = self._workers(), self._profiles()
            names = [m for m in self.policy.models if m in workers]
            if len(names) != len(self.policy.models) or any(m not in profiles for m in names):
                return
            obs = self._observe(names)
            busy = obs[_BUSY]
            if busy["area"] > 0 and busy["seconds"] > 0:
                self._concurrency = max(1, round(busy["area"] / busy["seconds"]))
            entry = self.policy.entry_model
            if self._concurrency == 0 or obs[entry]["rows_sampled"] < self.MIN_OBSERVED_TOKENS:
                seen = int(obs[entry]["rows_sampled"])
                for m in names:  # too little to go on (yet, or any more after a quiet while): no holding
                    if workers[m].batch_min != 1:
                        workers[m].set_batch_min(1)
                self._inputs = None
                self._prediction = self._no_prediction(
                    f"collecting observations ({seen} of {self.MIN_OBSERVED_TOKENS} tokens on {entry!r}): B = 1"
                )
                return
            routing: dict[str, RoutingStats] = {}
            latency: dict[str, TableLatency] = {}
            for m in [entry] + [n for n in names if n != entry]:  # the chain starts on the entry model
                o = obs[m]
                rows = o["rows_sampled"]
                routing[m] = RoutingStats(
                    h=min(1.0, o["handoffs_sent"] / rows) if rows > 0 else 1.0,
                    k=min(1.0, o["tokens_kept"] / rows) if rows > 0 else 1.0,
                    catch_up_tokens=o["catchup_tokens"] / o["catchups"] if o["catchups"] > 0 else 0.0,
                )
                latency[m] = calibrate(profiles[m].table, o)
            C = min(self._concurrency, self._MAX_MODEL_CONCURRENCY)
            sigma = self._shared_device(names)
            turns = all(workers[m].takes_turns for m in names)  # on one CPU the workers take turns
            bound = self.options.latency_bound_s
            # a hand-off's time between the workers (0 in one process; measured between Ray actors)
            delay = sum(workers[m].handoff_delay_s for m in names) / len(names)
            inputs = (
                C,
                sigma,
                turns,
                bound,
                delay,
                *[
                    v
                    for m in routing
                    for v in (routing[m].h, routing[m].k, routing[m].catch_up_tokens, latency[m].scale)
                ],
            )
            if self._prediction is not None and self._inputs is not None and _close(inputs, self._inputs):
                return  # nothing moved enough to re-pick
            prediction = choose_b(
                latency,
                routing,
                C,
                batch_wait_s=self.batch_wait_s,
                latency_bound_s=bound,
                max_batch={m: self.specs[m].max_num_seqs for m in names},
                shared_device=sigma,
                turns=turns,
                handoff_delay_s=delay,
            )
            self._inputs = inputs
            self._prediction = prediction
            for m, b in prediction.batch_min.items():
                worker = workers.get(m)
                if worker is not None and worker.batch_min != b:
                    worker.set_batch_min(b)


_BUSY = ("requests in flight",)  # a key no model name can equal
MIN_CALIBRATION_STEPS = 10
SCALE_LIMITS = (0.25, 4.0)


def calibrate(table: TableLatency, observed: Mapping) -> TableLatency:
    """Scale the profile so that the steps the worker ran, at the token counts they had, take the
    time they took. Real steps run slower than the profile's: the other model steps at the same
    time on the same memory, contexts are longer, and sampling and routing add to the forward."""
    hist = observed.get("step_tokens") or {}
    if observed.get("steps", 0) < MIN_CALIBRATION_STEPS or not hist:
        return table
    tokens = list(hist)
    expected = float(table.at(tokens) @ [hist[n] for n in tokens])
    if expected <= 0:
        return table
    lo, hi = SCALE_LIMITS
    return table.with_scale(min(hi, max(lo, observed["time_step"] / expected)))


def _close(x: tuple, y: tuple, rtol: float = 0.05) -> bool:
    """Every input within 5% of the last one's."""
    if len(x) != len(y):
        return False
    for a, b in zip(x, y):
        if a is None or b is None:
            if a is not b:
                return False
        elif not math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12):
            return False
    return True
