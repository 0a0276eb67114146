"""The public engine: an async context manager running one worker thread per model."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
import torch
from pydantic import ValidationError

from ..autobatch.controller import AutoBatching, profile_workers
from ..autobatch.latency_profile import LatencyProfile
from ..autobatch.throughput_model import ThroughputPrediction
from ..config import AutoBatchingOptions, EngineOptions, ModelSpec, SamplingParams
from ..engine.model.loader import LoadedModel
from ..engine.model_core import ModelCore
from ..engine.outbox import WorkerEvent
from ..engine.sequence import Request
from ..engine.worker.cpu_turns import CoreShare, usable_cores
from ..engine.worker.lockstep import LockstepDriver
from ..engine.worker.protocol import WorkerSettings
from ..engine.worker.stats import WorkerStats
from ..engine.worker.thread import WorkerThread
from ..errors import ConfigError, EngineNotRunningError, InvalidRequestError, ModelLoadError
from ..metrics import EngineMetrics, ModelMetrics
from ..metrics.recorder import RequestMetrics
from ..outputs import RequestOutput, StreamDelta
from ..policies import HIDDEN, STEP_FIELDS, VERIFY, Policy, RStitch, Single
from ..structured.compiler import GrammarCompiler
from .output_processor import OutputProcessor
from .prompts import Prompt, encode_prompt
from .request_channel import RequestChannel
from .tool_calls import ToolCallParser, ToolChoice, check_tool_choice, constrains, normalize_tools, parser_for

log = logging.getLogger(__name__)


def _check_verifying(policy: Policy, specs: dict[str, ModelSpec]) -> None:
    """A verifying policy bounds its drafts, and its verifier computes a whole check in one step."""
    md = policy.max_draft
    if isinstance(md, bool) or not isinstance(md, int) or md < 1:
        raise ConfigError(f"policy: a verifying policy needs max_draft, an int >= 1, got {md!r}")
    if HIDDEN in policy.requires:
        raise ConfigError(
            "policy: VERIFY and HIDDEN together are not supported (the hidden state of a corrected position)"
        )
    budget = specs[policy.verifier].max_num_batched_tokens
    if md + 1 > budget:
        raise ConfigError(
            f"policy: max_draft={md} needs {md + 1} tokens in one step of {policy.verifier!r}, whose "
            f"max_num_batched_tokens is {budget}"
        )


def _first_error(e: ValidationError) -> str:
    """The first error of a validation, as "<argument>: <what is wrong>"."""
    err = e.errors()[0]
    if err["type"] == "value_error":  # our own checks name the argument themselves
        return str(err["ctx"]["error"])
    where = ".".join(str(x) for x in err["loc"])
    return f"{where}: {err['msg']}"


def _default_models(policy: Policy) -> dict[str, ModelSpec]:
    """The demo pair from the store, for a policy that names its models "small" and "large"."""
    from .. import store

    if not isinstance(policy, Policy):
        raise ConfigError(f"policy: must be a Policy, got {type(policy).__name__}")
    unknown = [m for m in policy.models if m not in store.DEFAULT_MODELS]
    if unknown:
        raise ConfigError(
            f"models: not given, and the default demo pair only provides {sorted(store.DEFAULT_MODELS)}, "
            f"while the policy names {unknown}"
        )
    paths, missing = {}, []
    for m in policy.models:
        try:
            paths[m] = store.locate_model(store.DEFAULT_MODELS[m])
        except ModelLoadError:
            missing.append(store.DEFAULT_MODELS[m])
    if missing:
        raise ModelLoadError(
            f"models: not given, so the engine serves the demo pair, but {missing} is not in the store at "
            f"{store.home_dir()}; fetch it with `{store.pull_command('demo')}` (or pass models=...)"
        )
    return {m: ModelSpec(path=path) for m, path in paths.items()}


@dataclass
class ModelStats(WorkerStats):
    """A worker's statistics, and with delayed_batching="auto" the throughput model's current
    choice and prediction (the same object for every model)."""

    throughput_prediction: ThroughputPrediction | None = None


@dataclass(frozen=True)
class EngineHealth:
    healthy: bool  # running, with every worker alive
    running: bool  # started and not closed
    workers: dict[str, str]  # per model: "ok", "stopped", "stuck: ..." or the error that killed it


class Engine:
    """In-process serving of one or more models under a routing policy.

    >>> async with Engine(models={"m": "path/to/model"}) as engine:
    ...     out = await engine.generate("Hello", SamplingParams(max_tokens=16))

    With no models, the engine serves the demo pair from the local store (`tokenrouter pull
    demo`) as "small" and "large", under `RStitch(tau=0.03)` unless another policy is given.

    Each model gets a worker thread with its own scheduler and paged KV pool. `generate`,
    `stream` and `abort` may be called from any event loop (asyncio or trio) while it runs.

    - `policy`: the routing policy; default `Single(name)` when there is one model.
    - `num_threads`: if given, torch's intra-op thread count of each worker thread (the caller's
      own thread is left alone). None: workers on CPU take turns, each step alone on every core
      (`engine/worker/cpu_turns.py`); a worker with nothing to do costs the others nothing.
    - `delayed_batching`: B, one int or per model: a worker waits (at most `batch_wait_s`) until
      B requests are ready before it steps, so hand-offs do not fragment batches. None: B = 1.
      "auto": B from the throughput model (`autobatch/throughput_model.py`): the engine profiles each
      model's step latency at start (`profile()`, cached under the store home), observes the
      routing online, and re-picks B every `auto_batching.interval_s`; B = 1 until it has seen
      enough tokens. `throughput_prediction()` shows the current choice and what it predicts.
    - `mode`: "routed" (this engine). "standard" and "lockstep" reproduce the baselines that
      speed is measured against: every hand-off goes back to the caller and is re-sent as a new
      request with the whole sequence (KV freed, re-prefill), or one thread steps each model's
      batch in turn.
    - `auto_batching`: the knobs of delayed_batching="auto" (`AutoBatchingOptions`: seconds
      between re-picks, a bound on the predicted per-token latency, the shared-device share).
    - `ray_address`, `placement_strategy`: for models with `ModelSpec(placement=RayPlacement(...))`,
      whose workers run in Ray actors (docs/distributed.md): the cluster (None: the one this
      process is connected to, else the one `ray start` runs here; "local": start one for this
      engine, stopped when it closes; or an address), and a placement group strategy for their
      actors (None: each scheduled on its own resources). `close()` ends the actors (and the
      group) it made, never a cluster it did not start.

    Every argument is checked at construction (`EngineOptions`); a bad one raises `ConfigError`
    naming it.
    """

    def __init__(
        self,
        models: Mapping[str, str | Path | ModelSpec] | None = None,
        policy: Policy | None = None,
        *,
        num_threads: int | None = None,
        delayed_batching: int | Mapping[str, int] | Literal["auto"] | None = None,
        batch_wait_s: float = 0.02,
        mode: Literal["routed", "standard", "lockstep"] = "routed",
        stop_timeout: float = 30.0,
        auto_batching: AutoBatchingOptions | Mapping | None = None,
        ray_address: str | None = None,
        placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = None,
    ):
        if models is None:
            policy = RStitch(tau=0.03) if policy is None else policy
            models = _default_models(policy)
        if not isinstance(models, Mapping):
            raise ConfigError(f"models: must be a dict of name -> path or ModelSpec, got {type(models).__name__}")
        if not models:
            raise ConfigError("models: give at least one model, e.g. Engine(models={'m': 'path/to/model'})")
        self.specs: dict[str, ModelSpec] = {}
        for name, value in models.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"models: model names must be non-empty strings, got {name!r}")
            try:
                self.specs[name] = ModelSpec.coerce(value)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"models[{name!r}]: {e}") from e
        if policy is None:
            if len(self.specs) != 1:
                raise ConfigError("policy: several models need a routing policy")
            policy = Single(next(iter(self.specs)))
        if not isinstance(policy, Policy):
            raise ConfigError(f"policy: must be a Policy, got {type(policy).__name__}")
        unknown = sorted(set(policy.requires) - STEP_FIELDS)
        if unknown:
            raise ConfigError(f"policy: requires step-result fields {unknown} that the engine does not provide")
        missing = [m for m in policy.models if m not in self.specs]
        if missing:
            raise ConfigError(f"policy: names model(s) {missing} that are not in models {sorted(self.specs)}")
        if VERIFY in policy.requires:
            _check_verifying(policy, self.specs)
        try:
            self.options = EngineOptions.model_validate(
                {
                    "num_threads": num_threads,
                    "delayed_batching": delayed_batching,
                    "batch_wait_s": batch_wait_s,
                    "mode": mode,
                    "stop_timeout": stop_timeout,
                    "auto_batching": auto_batching,
                    "ray_address": ray_address,
                    "placement_strategy": placement_strategy,
                },
                context={"models": list(self.specs)},
            )
        except ValidationError as e:
            raise ConfigError(_first_error(e)) from None
        self.mode = self.options.mode
        self.num_threads = self.options.num_threads
        self.batch_wait_s = self.options.batch_wait_s
        self.stop_timeout = self.options.stop_timeout
        self.auto_batching = self.options.delayed_batching == "auto"
        self.batch_min = self.options.batch_min(list(self.specs))
        self.policy = policy
        self.placed = [name for name, spec in self.specs.items() if spec.placement is not None]
        self._check_placement()
        self._fleet = None  # with placed models: the actors and the order of their events (distributed/)
        self._share: CoreShare | None = None  # workers on CPU: their turns and compute thread
        self.loaded: dict[str, LoadedModel] = {}
        self.workers: dict[str, WorkerThread] = {}
        self._channels: dict[str, RequestChannel] = {}
        self._requests: dict[str, Request] = {}
        self._families: dict[str, list[str]] = {}  # n > 1: a request id -> its samples' ids
        self._grammars: GrammarCompiler | None = None  # structured output, over the entry model's vocabulary
        self._running = False
        self.stuck_workers: list[str] = []  # workers the last close() had to abandon
        self.profiles: dict[str, LatencyProfile] = {}
        self._request_metrics = RequestMetrics(list(self.specs))  # what metrics() reports of ended requests
        self._auto: AutoBatching | None = None  # delayed_batching="auto": autobatch/controller.py
        if self.auto_batching:
            self._auto = AutoBatching(
                policy=policy,
                specs=self.specs,
                batch_wait_s=self.batch_wait_s,
                options=self.options.auto_batching,
                workers=lambda: self.workers,
                loaded=lambda: self.loaded,
                profiles=lambda: self.profiles,
                in_flight=self._in_flight,
            )

    def _in_flight(self) -> int:
        """Requests submitted and not yet ended: what load-aware planners (auto B, Speculative's
        draft length, the actors' copies of the policy) plan for."""
        return len(self._requests)

    def _check_placement(self) -> None:
        """Ray options need a placed model; placed models need Ray, and their own stepping threads."""
        if not self.placed:
            for name in ("ray_address", "placement_strategy"):
                if getattr(self.options, name) is not None:
                    raise ConfigError(f"{name}: no model has a placement (ModelSpec(placement=RayPlacement(...)))")
            return
        from ..distributed.ray_runtime import ray_installed

        if not ray_installed():
            raise ConfigError(f"models[{self.placed[0]!r}].placement: needs Ray: pip install 'tokenrouter[ray]'")
        if self.mode == "lockstep":
            raise ConfigError(
                "mode: 'lockstep' steps every model from one thread, so no model can be placed in a Ray actor"
            )

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Load every model (one at a time, to bound peak memory) and start the workers."""
        if self._running:
            raise EngineNotRunningError("the engine is already running")
        share = self._share = self._core_share()
        if share is not None:
            share.start()
        wake = threading.Event() if self.mode == "lockstep" else None  # one driver hears every worker
        if self.placed:  # some models in Ray actors (distributed/)
            workers = await self._launch_fleet(share)
        else:
            workers = {
                name: WorkerThread(
                    ModelCore(name, spec, self.policy, keep_kv_on_handoff=self.mode != "standard"),
                    self._dispatch,
                    WorkerSettings(self.batch_min[name], self.batch_wait_s, self.num_threads),
                    core_share=share if torch.device(spec.device).type == "cpu" else None,
                    wake=wake,
                )
                for name, spec in self.specs.items()
            }
            for worker in workers.values():
                worker.connect(workers)
        try:
            # Models load in their workers' threads, one after another to bound peak memory.
            if self.mode == "lockstep":
                LockstepDriver(list(workers.values()), wake).start()
            for name, worker in workers.items():
                if self.mode != "lockstep":
                    worker.start()
                self.loaded[name] = await anyio.to_thread.run_sync(worker.wait_ready)
            self.workers = workers
            if self._fleet is not None:  # the transport between workers in other processes, once all loaded
                await anyio.to_thread.run_sync(self._fleet.measure_links)
            self._check_tokenizers()
            entry = self.loaded[self.policy.entry_model]
            eos = frozenset().union(*(self.loaded[m].eos_token_ids for m in self.policy.models))
            self._grammars = GrammarCompiler(entry.tokenizer, entry.vocab_size, eos)
            self.policy.validate(dict(self.loaded))  # e.g. a learned router trained for another pair
            self.policy.use_in_flight(self._in_flight)
            if self._auto is not None or self.policy.wants_profiles:
                try:
                    await self.profile()
                except Exception as e:  # serve anyway: B = 1, and the policy on its defaults
                    log.error("profiling the models failed: %s", e)
                    if self._auto is not None:
                        self._auto.profiling_failed(e)
                if self.policy.wants_profiles and len(self.profiles) == len(self.specs):
                    self.policy.use_profiles(dict(self.profiles))
                    if self._fleet is not None:  # the copies of the policy in the actors
                        await anyio.to_thread.run_sync(self._fleet.use_profiles, dict(self.profiles))
        except BaseException:
            for worker in workers.values():
                worker.stop()
            self._stop_share(timeout=self.stop_timeout)
            await self._close_fleet(self.stop_timeout)
            self.loaded.clear()
            self.workers = {}
            raise
        self._running = True
        if self._auto is not None:
            self._auto.start()  # only with every model's profile

    async def _launch_fleet(self, share: CoreShare | None) -> dict:
        """Connect to Ray and create the actors of the placed models (and the workers of the
        others, which then talk to them): distributed/fleet.py."""
        from ..distributed import Fleet

        self._fleet = Fleet(
            self.specs, self.policy, self.options, self.batch_min, self._dispatch, self._in_flight, share
        )
        try:
            return await anyio.to_thread.run_sync(self._fleet.launch)
        except BaseException:
            self._stop_share(timeout=self.stop_timeout)
            await self._close_fleet(self.stop_timeout)
            raise

    async def _close_fleet(self, timeout: float) -> None:
        if self._fleet is not None:
            fleet, self._fleet = self._fleet, None
            await anyio.to_thread.run_sync(fleet.close, timeout)

    def _stop_share(self, timeout: float) -> None:
        if self._share is not None:
            self._share.stop(timeout)
            self._share = None

    def _core_share(self) -> CoreShare | None:
        """Without `num_threads`, workers on CPU take turns, each step alone on every core (those
        in this process: a worker in a Ray actor has its own)."""
        on_cpu = sum(torch.device(s.device).type == "cpu" and s.placement is None for s in self.specs.values())
        if self.num_threads is not None or self.mode == "lockstep" or on_cpu < 2:
            return None
        return CoreShare(usable_cores())

    def _check_tokenizers(self) -> None:
        """Routed models must share one vocabulary: a token id must mean the same to each of them."""
        names = self.policy.models
        first = self.loaded[names[0]]
        vocab = first.tokenizer.get_vocab()
        for name in names[1:]:
            other = self.loaded[name]
            if other.tokenizer.get_vocab() != vocab:
                raise ConfigError(
                    f"models {names[0]!r} ({first.spec.path}) and {name!r} ({other.spec.path}) have different "
                    "tokenizers; token-level routing needs one shared vocabulary"
                )

    async def close(self) -> None:
        """Stop the workers; requests still in flight end with finish_reason 'abort'."""
        if not self.workers:
            return
        self._running = False
        if self._auto is not None and self._auto.running:
            await anyio.to_thread.run_sync(self._auto.stop)
        for worker in self.workers.values():
            worker.stop()
        stuck = []
        deadline = time.monotonic() + self.stop_timeout  # one deadline for all: exit never waits longer
        for name, worker in self.workers.items():
            left = max(0.0, deadline - time.monotonic())
            if not await anyio.to_thread.run_sync(worker.join, left):
                stuck.append(name)
        self._stop_share(timeout=max(0.0, deadline - time.monotonic()))
        await self._close_fleet(timeout=max(1.0, deadline - time.monotonic()))
        self.workers.clear()
        self.loaded.clear()
        self.stuck_workers = stuck
        if stuck:
            log.error("worker(s) %s did not stop within %.1f s and were abandoned", stuck, self.stop_timeout)
            # Their requests would otherwise wait forever: end them here.
            error = f"the engine closed while worker(s) {stuck} were stuck"
            for rid, channel in list(self._channels.items()):
                channel.push(WorkerEvent(rid, [], stuck[0], finish_reason="abort", error=error))

    # ---- requests --------------------------------------------------------------------------
    def _dispatch(self, events: list[WorkerEvent]) -> None:
        """Worker threads deliver each step's events here."""
        for ev in events:
            channel = self._channels.get(ev.request_id)
            if channel is not None:
                channel.push(ev)

    def _new_request(
        self, prompt: Prompt, params: SamplingParams | None, request_id: str | None, tools: list[dict] | None = None
    ) -> Request:
        if not self._running:
            raise EngineNotRunningError("the engine is not running: use `async with Engine(...)` or `await start()`")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", f"must be SamplingParams, got {type(params).__name__}")
        entry = self.loaded[self.policy.entry_model]
        worker = self.workers[self.policy.entry_model]
        if not worker.alive:
            raise EngineNotRunningError(f"worker {entry.name!r} is not running: {worker.error or 'stopped'}")
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id", "must be a non-empty string")
        if request_id in self._channels:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        bad = [t for t in params.stop_token_ids if t >= entry.vocab_size]
        if bad:
            raise InvalidRequestError("stop_token_ids", f"{bad[0]} is outside the vocabulary [0, {entry.vocab_size})")
        ids = encode_prompt(entry.tokenizer, prompt, entry.vocab_size, entry.max_model_len, tools)
        return Request(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else random.getrandbits(63),
            stop_token_ids=frozenset(params.stop_token_ids),
            max_tokens=min(params.max_tokens, entry.max_model_len - len(ids)),
        )

    def _check_admissible(self, req: Request) -> None:
        """Every model the request may visit is serving, and its pool can hold the whole request."""
        for name in self.policy.models:
            worker = self.workers[name]
            if not worker.alive:
                raise EngineNotRunningError(
                    f"worker {name!r} is not running ({worker.error or 'stopped'}); close the engine and start it again"
                )
        need = len(req.prompt_ids) + req.max_tokens
        for name in self.policy.models:
            holds = self.workers[name].capacity_tokens
            if need > holds:
                field = "prompt" if len(req.prompt_ids) >= holds else "max_tokens"
                raise InvalidRequestError(
                    field,
                    f"the request needs KV for {need} tokens (prompt {len(req.prompt_ids)} + max_tokens "
                    f"{req.max_tokens}), but model {name!r}'s pool holds {holds} tokens",
                )

    async def _prepare(
        self, prompt: Prompt, params: SamplingParams | None, request_id: str | None, tools, tool_choice: ToolChoice
    ) -> tuple[list[Request], ToolCallParser | None]:
        """Validate and build a request (with its grammar compiled, off the event loop), and its n
        samples: the first keeps the id and the seed, the others get `<id>/<i>` and seeds of their own."""
        if tools is not None:
            tools = normalize_tools(tools)
        tool_choice = check_tool_choice(tool_choice, tools)
        if constrains(tool_choice) and isinstance(params, SamplingParams) and params.response_format is not None:
            raise InvalidRequestError(
                "tool_choice", f"{tool_choice!r} constrains the output, and so does response_format"
            )
        req = self._new_request(prompt, params, request_id, tools)
        self._check_admissible(req)
        parser = None
        if tools is not None and tool_choice != "none":
            parser = parser_for(self.loaded[self.policy.entry_model].tokenizer, tools)
        fmt = req.params.response_format
        if fmt is not None:
            req.grammar = await anyio.to_thread.run_sync(self._grammars.compile, fmt)
        elif parser is not None and constrains(tool_choice):
            tag = parser.structural_tag(tools, tool_choice)
            req.grammar = await anyio.to_thread.run_sync(self._grammars.compile_structural_tag, tag)
        samples = [req] + [
            dataclasses.replace(req, request_id=f"{req.request_id}/{i}", seed=_sample_seed(req.seed, i))
            for i in range(1, req.params.n)
        ]
        if any(s.request_id in self._channels for s in samples[1:]):
            raise InvalidRequestError("request_id", f"{req.request_id!r}'s samples' ids are already in use")
        return samples, parser

    async def _follow(
        self, reqs: list[Request], parser: ToolCallParser | None = None
    ) -> AsyncIterator[tuple[int, StreamDelta, OutputProcessor]]:
        """Submit a request, or the samples of an n > 1 request, and yield (sample, delta, its
        processor) until each has ended on every worker. Samples after the first are submitted
        once a worker has reported on the first, that is after its entry model took the prompt in,
        so they find the prompt's full blocks in the prefix cache instead of computing them again.
        All of them share one channel."""
        channel = RequestChannel(reqs[0].request_id)
        tokenizer = self.loaded[self.policy.entry_model].tokenizer
        procs: dict[str, tuple[int, OutputProcessor]] = {}
        for i, req in enumerate(reqs):
            self._channels[req.request_id] = channel
            self._requests[req.request_id] = req
            procs[req.request_id] = (i, OutputProcessor(tokenizer, req))
        if len(reqs) > 1:
            self._families[reqs[0].request_id] = [r.request_id for r in reqs]
        if self._auto is not None:
            self._auto.count_inflight()
        aborted: set[str] = set()
        submitted: list[OutputProcessor] = []
        later = reqs[1:]
        try:
            self._submit(reqs[0])
            submitted.append(procs[reqs[0].request_id][1])
            while not all(p.worker_done for _, p in procs.values()):
                events = await channel.get()
                if later:  # the first sample's first report: its prompt is in the entry model's cache
                    for req in later:
                        self._submit(req)
                        submitted.append(procs[req.request_id][1])
                    later = []
                for ev in events:
                    i, proc = procs[ev.request_id]
                    try:
                        delta = proc.process(ev)
                    except Exception as e:  # e.g. the tokenizer failed to decode: fail this request only
                        log.exception("request %s: building its output failed", ev.request_id)
                        delta = proc.fail(f"building the output failed: {type(e).__name__}: {e}", ev)
                    if ev.resubmit is not None:  # standard-serving baseline: the client re-sends
                        self._resubmit(ev.resubmit, proc.req, proc)
                    if delta is not None:
                        delta.index = i
                        if delta.output is not None and parser is not None:
                            _parse_tool_calls(delta.output, parser)
                        yield i, delta, proc
                for rid, (_, proc) in procs.items():
                    if proc.done and not proc.worker_done and rid not in aborted:
                        self._abort_everywhere(proc.req)  # a stop string or a failure here ended it
                        aborted.add(rid)
        finally:
            for rid, (_, proc) in procs.items():
                if not proc.worker_done:  # cancelled, or the consumer left: free its KV everywhere
                    self._abort_everywhere(proc.req)
                self._channels.pop(rid, None)
                self._requests.pop(rid, None)
            self._families.pop(reqs[0].request_id, None)
            if self._auto is not None:
                self._auto.count_inflight()
            for proc in submitted:  # each sample's life ends here, exactly once; not yet ended means abort
                self._request_metrics.record(proc.output())

    def _submit(self, req: Request) -> None:
        model = self.policy.start_model()
        if model not in self.workers:
            raise ConfigError(
                f"{self.policy!r}.start_model() gave {model!r}, not one of its models {self.policy.models}"
            )
        if self._fleet is not None:
            self._fleet.submitted(req, model)
        if not self.workers[model].submit(req):
            raise EngineNotRunningError(f"worker {model!r} is not running")

    def _resubmit(self, msg, req: Request, proc: OutputProcessor) -> None:
        """Send a handed-off request to its next model as a new request with the whole sequence."""
        if req.aborted or proc.done or not self.workers[msg.target].hand_off(msg, req):
            proc.process(WorkerEvent(req.request_id, [], msg.source, finish_reason="abort"))

    def _abort_everywhere(self, req: Request) -> None:
        req.aborted = True  # a hand-off still in transit ends when it arrives
        for worker in self.workers.values():
            worker.abort(req.request_id)

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
    ) -> RequestOutput:
        """Run a request to its end. A failed request returns finish_reason 'error' with `error` set.

        `tools` (OpenAI's function shape; the prompt must be chat messages) are rendered by the
        chat template, and the calls the model makes come back parsed in `tool_calls`.
        `tool_choice`: "auto" (the model decides, unconstrained), "none" (nothing parsed),
        "required" or {"type": "function", "function": {"name": NAME}}: the output is constrained
        to calls whose arguments follow the tools' schemas. With `params.n > 1`, the output is
        the first sample's and `completions` holds every sample."""
        reqs, parser = await self._prepare(prompt, params, request_id, tools, tool_choice)
        return await self._run(reqs, parser)

    async def generate_batch(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
    ) -> list[RequestOutput]:
        """Run every prompt at once, so the workers batch them; the outputs in prompt order.
        `params` is one SamplingParams for all, or one per prompt; `tools` as for `generate`, for
        every prompt. Every request is checked before any is submitted: a bad one raises the error
        `generate` would, saying which request, and none runs."""
        if isinstance(prompts, (str, bytes, bytearray, memoryview)) or not isinstance(prompts, Sequence):
            raise InvalidRequestError("prompts", f"must be a list of prompts, got {type(prompts).__name__}")
        n = len(prompts)
        if params is None or isinstance(params, SamplingParams):
            each = [params] * n
        elif isinstance(params, Sequence) and not isinstance(params, str):
            if len(params) != n:
                raise InvalidRequestError(
                    "params", f"{len(params)} SamplingParams for {n} prompts; give one for all, or one per prompt"
                )
            each = list(params)
        else:
            raise InvalidRequestError(
                "params", f"must be SamplingParams or a list of them, got {type(params).__name__}"
            )
        prepared = []
        for i, (prompt, p) in enumerate(zip(prompts, each)):
            try:
                prepared.append(await self._prepare(prompt, p, None, tools, tool_choice))
            except InvalidRequestError as e:
                raise InvalidRequestError(e.field, f"{e.message} (request {i} of {n})") from e
        outs: list[RequestOutput | None] = [None] * n
        errors: list[Exception] = []

        async def one(i: int) -> None:
            try:
                outs[i] = await self._run(*prepared[i])
            except Exception as e:  # e.g. a worker died: raised as itself, not in an exception group
                errors.append(e)
                tg.cancel_scope.cancel()  # the others end with the call

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        if errors:
            raise errors[0]
        return outs  # type: ignore[return-value]

    async def _run(self, reqs: list[Request], parser: ToolCallParser | None) -> RequestOutput:
        """A request (its samples) to its end: the first sample's output, with every sample's."""
        procs: dict[int, OutputProcessor] = {}
        async for i, _, proc in self._follow(reqs, parser):
            procs[i] = proc
        outs = []
        for i in range(len(reqs)):  # each sample's last delta came with its end
            out = procs[i].output()
            if parser is not None:
                _parse_tool_calls(out, parser)
            outs.append(out)
        if len(outs) > 1:  # the first sample, and every sample (the first as a copy: no cycle)
            outs[0].completions = [dataclasses.replace(outs[0], completions=[])] + outs[1:]
        return outs[0]

    async def chat(
        self,
        messages: list[dict],
        params: SamplingParams | None = None,
        *,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        request_id: str | None = None,
    ) -> RequestOutput:
        """`generate` for a conversation: `messages` are chat messages, `tools` as for `generate`."""
        if (
            isinstance(messages, str)
            or not isinstance(messages, list)
            or not all(isinstance(m, Mapping) for m in messages)
        ):
            raise InvalidRequestError("messages", "must be a list of chat message dicts")
        return await self.generate(messages, params, request_id=request_id, tools=tools, tool_choice=tool_choice)

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
    ) -> AsyncIterator[StreamDelta]:
        """Yield text as it is produced; the last delta carries finish_reason. Leaving early aborts.
        With `params.n > 1` the samples' deltas interleave, each with its `index`, and each
        sample has its own last delta."""
        reqs, parser = await self._prepare(prompt, params, request_id, tools, tool_choice)
        follow = self._follow(reqs, parser)
        try:
            async for _, delta, _ in follow:
                yield delta
        finally:
            await follow.aclose()

    async def abort(self, request_id: str) -> None:
        """End a request early (every sample of an n > 1 request); its generate/stream ends with
        finish_reason 'abort'."""
        for rid in self._families.get(request_id, [request_id]):
            req = self._requests.get(rid)
            if req is not None:
                self._abort_everywhere(req)

    # ---- introspection ---------------------------------------------------------------------
    def health(self) -> EngineHealth:
        """Whether the engine can take requests; per worker "ok", "stopped", or why it died."""
        workers = {}
        for name in self.specs:
            worker = self.workers.get(name)
            if worker is None:
                workers[name] = "stuck: did not stop when closed" if name in self.stuck_workers else "stopped"
            elif worker.alive:
                workers[name] = "ok"
            else:
                workers[name] = worker.error or "stopped"
        healthy = self._running and all(v == "ok" for v in workers.values())
        return EngineHealth(healthy=healthy, running=self._running, workers=workers)

    def metrics(self) -> EngineMetrics:
        """A snapshot for dashboards (docs/sdk.md): requests ended since the engine was made, by
        finish reason, with time-to-first-token and latency histograms, tokens per model and
        hand-offs; and each running worker's KV blocks and queues. Any thread may call it."""
        models = {name: ModelMetrics.from_stats(w.stats()) for name, w in list(self.workers.items())}
        return self._request_metrics.snapshot(models)

    def stats(self) -> dict[str, ModelStats]:
        """Per model: KV blocks total/free, running/waiting counts, step timings, B in force and,
        with delayed_batching="auto", the throughput model's prediction."""
        pred = self._auto.prediction if self._auto is not None else None
        return {name: ModelStats(**vars(w.stats()), throughput_prediction=pred) for name, w in self.workers.items()}

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Forget every cached prefix that no request in flight holds, in every worker (between
        its steps), so later requests start cold as on a fresh engine: benchmarks reuse a loaded
        engine this way. Returns the blocks forgotten per model."""
        if not self.workers:
            raise EngineNotRunningError("the engine is not running: use `async with Engine(...)` or `await start()`")
        futures = {name: w.reset_prefix_cache() for name, w in self.workers.items()}
        return {name: await anyio.to_thread.run_sync(f.result) for name, f in futures.items()}

    # ---- delayed_batching="auto": the throughput model (autobatch/controller.py) ------------
    async def profile(self, refresh: bool = False) -> dict[str, LatencyProfile]:
        """Each model's step-latency profile (`autobatch/latency_profile.py`): read from the cache under
        the store home (`profiles/<key>.json`), else measured now in the worker's own thread,
        between its steps, one model at a time, and cached. `refresh=True` measures again."""
        if not self.workers:
            raise EngineNotRunningError("the engine is not running: use `async with Engine(...)` or `await start()`")
        out = await profile_workers(self.workers, refresh)
        self.profiles.update(out)
        return out

    def throughput_prediction(self, refresh: bool = False) -> ThroughputPrediction | None:
        """With delayed_batching="auto": the throughput model's current choice of B per model and
        what it predicts (tokens/s, per-token latency, the routing statistics and step-latency
        models it used). `refresh=True` re-picks B now from what has been observed so far.
        None without "auto", or before the engine has started."""
        if self._auto is None:
            return None
        if refresh and self.workers and self.profiles:
            self._auto.retune()
        return self._auto.prediction

    @property
    def _auto_thread(self) -> threading.Thread | None:  # the controller's thread (tests check it stops)
        return self._auto.thread if self._auto is not None else None


def _sample_seed(seed: int, i: int) -> int:
    """Sample i's seed: a stream of its own, reproducible from the request's (the golden-ratio step)."""
    return (seed + i * 0x9E3779B97F4A7C15) % (1 << 63)


def _parse_tool_calls(out: RequestOutput, parser: ToolCallParser) -> None:
    out.content, out.tool_calls = parser.parse(out.text)
