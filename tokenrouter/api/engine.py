"""The public engine: an async context manager running one worker per model.

`Engine` owns the lifecycle and the public calls; what it does is in its parts: `setup.py`
checks what it was given, `served_models.py` starts and stops its models (with `launch.py`, the
workers for its mode), `profiling.py` keeps the latency profiles and the throughput model,
`input_processor.py` turns a caller's input into requests, `request_tracker.py` follows them to
their end, and `views.py` holds the plain values a caller reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import anyio

from ..autobatch import LatencyProfile, ThroughputPrediction
from ..config import ModelSpec, SamplingParams
from ..errors import EngineNotRunningError, InvalidRequestError
from ..metrics import EngineMetrics, ModelMetrics, RequestMetrics
from ..outputs import RequestOutput, StreamDelta
from ..policies import Policy
from ..testing import lend, take_back
from .input_processor import check_deadline, params_per_prompt
from .launch import Launcher
from .profiling import Profiling
from .prompts import Prompt
from .request_tracker import RequestTracker
from .served_models import ServedModels
from .setup import plan_engine
from .tool_calls import ToolCallParser, ToolChoice
from .views import EngineHealth, EngineInfo, ModelStats

NOT_RUNNING = "the engine is not running: use `async with Engine(...)` or `await start()`"


class Engine:
    """In-process serving of one or more models under a routing policy.

    >>> async with Engine(models={"m": "path/to/model"}) as engine:
    ...     out = await engine.generate("Hello", SamplingParams(max_tokens=16))

    With no models, the engine serves the demo pair from the local store (`tokenrouter pull
    demo`) as "small" and "large", under `RStitch(tau=0.03)` unless another policy is given;
    with one model, the policy defaults to `Single`. Each model gets a worker with its own
    scheduler and paged KV pool. `generate`, `stream` and `abort` may be called from any event
    loop (asyncio or trio) while it runs.

    The keyword arguments are the fields of `EngineOptions` (config/engine.py), each described
    once: `num_threads`, `delayed_batching` (B, or "auto" from the throughput model),
    `batch_wait_s`, `mode` ("routed", or the "standard" and "lockstep" baselines), `stop_timeout`,
    `auto_batching`, `ray_address` and `placement_strategy` (docs/sdk.md lists them). Everything
    is checked at construction; a bad argument raises `ConfigError` naming it.

    Its parts are private: what a caller reads goes through `info()`, `stats()`, `health()` and
    `metrics()`; tests reach a worker through `tokenrouter.testing`, which the engine lends it to.
    """

    def __init__(
        self,
        models: Mapping[str, str | Path | ModelSpec] | None = None,
        policy: Policy | None = None,
        **options,
    ):
        plan = plan_engine(models, policy, options)
        self._plan = plan
        self._running = False
        self._request_metrics = RequestMetrics(list(plan.specs))  # what metrics() reports of ended requests
        self._profiling = Profiling(plan, self._in_flight, lambda: self._models.workers, lambda: self._models.loaded)
        self._launcher = Launcher(plan, self._dispatch, self._in_flight)
        self._tracker = RequestTracker(
            plan.policy,
            self._launcher.before_submit,
            self._request_metrics.record,
            in_flight_changed=self._profiling.count_inflight,  # the throughput model counts requests
        )
        self._models = ServedModels(plan, self._launcher, self._tracker, self._profiling)

    def _in_flight(self) -> int:
        """Requests submitted and not yet ended: what load-aware planners (auto B, Speculative's
        draft length, the actors' copies of the policy) plan for."""
        return len(self._tracker)

    def _dispatch(self, events) -> None:
        """Where every worker delivers each step's events (the tracker is made after the launcher
        that hands this to the workers)."""
        self._tracker.dispatch(events)

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
        await self._models.start(self._in_flight)  # api/served_models.py: the start sequence
        self._running = True
        self._profiling.start()  # the throughput model, with every model's profile
        lend(self, self._models.workers, self._models.loaded, self._in_flight)

    async def close(self) -> None:
        """Stop the workers; requests still in flight end with finish_reason 'abort'."""
        if not self._models.workers:
            return
        self._running = False
        take_back(self)
        await self._profiling.stop()
        await self._models.stop()

    # ---- requests --------------------------------------------------------------------------
    async def _prepare(self, prompt, params, request_id, tools, tool_choice, parallel_tool_calls=True):
        """A caller's input checked and turned into requests (one per sample) and its tool-call parser."""
        if not self._running:
            raise EngineNotRunningError(NOT_RUNNING)
        return await self._models.inputs.prepare(prompt, params, request_id, tools, tool_choice, parallel_tool_calls)

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> RequestOutput:
        """Run a request to its end. A failed request returns finish_reason 'error' with `error` set.

        `tools` (OpenAI's function shape; the prompt must be chat messages) are rendered by the
        chat template, and the calls the model makes come back parsed in `tool_calls`.
        `tool_choice`: "auto" (the model decides, unconstrained), "none" (nothing parsed),
        "required" or {"type": "function", "function": {"name": NAME}}: the output is constrained
        to calls whose arguments follow the tools' schemas. `parallel_tool_calls=False`: at most
        one call. With `params.response_format` under "auto", the output is either calls or that
        format. `deadline_s`: past it the request ends with finish_reason 'abort'. With
        `params.n > 1`, the output is the first sample's and `completions` holds every sample."""
        check_deadline(deadline_s)
        reqs, parser = await self._prepare(prompt, params, request_id, tools, tool_choice, parallel_tool_calls)
        return await self._run(reqs, parser, deadline_s)

    async def generate_batch(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt at once, so the workers batch them; the outputs in prompt order.
        `params` is one SamplingParams for all, or one per prompt; the other arguments as for
        `generate`, for every prompt. Every request is checked before any is submitted: a bad one
        raises the error `generate` would, saying which request, and none runs."""
        check_deadline(deadline_s)
        each = params_per_prompt(prompts, params)
        n = len(prompts)
        prepared = []
        for i, (prompt, p) in enumerate(zip(prompts, each)):
            try:
                prepared.append(await self._prepare(prompt, p, None, tools, tool_choice, parallel_tool_calls))
            except InvalidRequestError as e:
                raise InvalidRequestError(e.field, f"{e.message} (request {i} of {n})") from e
        outs: list[RequestOutput | None] = [None] * n
        errors: list[Exception] = []

        async def one(i: int) -> None:
            try:
                outs[i] = await self._run(*prepared[i], deadline_s)
            except Exception as e:  # e.g. a worker died: raised as itself, not in an exception group
                errors.append(e)
                tg.cancel_scope.cancel()  # the others end with the call

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        if errors:
            raise errors[0]
        return outs  # type: ignore[return-value]

    async def _run(self, reqs, parser: ToolCallParser | None, deadline_s: float | None = None) -> RequestOutput:
        """A request (its samples) to its end: the first sample's output, with every sample's."""
        procs, finals = {}, {}
        async for i, delta, proc in self._tracker.follow(reqs, parser, deadline_s):
            procs[i] = proc
            if delta.output is not None:  # each sample's last delta, its tool calls taken out
                finals[i] = delta.output
        outs = [finals[i] if i in finals else procs[i].output() for i in range(len(reqs))]
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
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> RequestOutput:
        """`generate` for a conversation: `messages` are chat messages, the rest as for `generate`."""
        if (
            isinstance(messages, str)
            or not isinstance(messages, list)
            or not all(isinstance(m, Mapping) for m in messages)
        ):
            raise InvalidRequestError("messages", "must be a list of chat message dicts")
        return await self.generate(
            messages,
            params,
            request_id=request_id,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            deadline_s=deadline_s,
        )

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        deadline_s: float | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """Yield text as it is produced; the last delta carries finish_reason. Leaving early aborts.
        With tools, each call comes whole in the delta where it closed (`delta.tool_calls`), never
        as text; the other arguments as for `generate`. With `params.n > 1` the samples' deltas
        interleave, each with its `index`, and each sample has its own last delta."""
        check_deadline(deadline_s)
        reqs, parser = await self._prepare(prompt, params, request_id, tools, tool_choice, parallel_tool_calls)
        follow = self._tracker.follow(reqs, parser, deadline_s)
        try:
            async for _, delta, _ in follow:
                yield delta
        finally:
            await follow.aclose()

    async def abort(self, request_id: str) -> None:
        """End a request early (every sample of an n > 1 request); its generate/stream ends with
        finish_reason 'abort'."""
        self._tracker.abort(request_id)

    # ---- introspection ---------------------------------------------------------------------
    def info(self) -> EngineInfo:
        """What the engine serves, as read-only values (api/views.py): its policy and entry model,
        each model's spec and, once started, what it loaded as (precision, kernels, dtypes,
        tokenizer, context length), the latency profiles so far, and whether it runs."""
        return EngineInfo.of(
            self._plan.policy, self._plan.specs, self._models.loaded, self._profiling.profiles, self._running
        )

    def health(self) -> EngineHealth:
        """Whether the engine can take requests; per worker "ok", "stopped", or why it died."""
        return self._models.health(self._running)

    def metrics(self) -> EngineMetrics:
        """A snapshot for dashboards (docs/sdk.md): requests ended since the engine was made, by
        finish reason, with time-to-first-token and latency histograms, tokens per model and
        hand-offs; and each running worker's KV blocks and queues. Any thread may call it."""
        models = {name: ModelMetrics.from_stats(w.stats()) for name, w in list(self._models.workers.items())}
        return self._request_metrics.snapshot(models)

    def stats(self) -> dict[str, ModelStats]:
        """Per model: KV blocks total/free, running/waiting counts, step timings, B in force and,
        with delayed_batching="auto", the throughput model's prediction."""
        pred = self._profiling.prediction()
        return {
            name: ModelStats(**vars(w.stats()), throughput_prediction=pred) for name, w in self._models.workers.items()
        }

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Forget every cached prefix that no request in flight holds, in every worker (between
        its steps), so later requests start cold as on a fresh engine: benchmarks reuse a loaded
        engine this way. Returns the blocks forgotten per model."""
        if not self._models.workers:
            raise EngineNotRunningError(NOT_RUNNING)
        futures = {name: w.reset_prefix_cache() for name, w in self._models.workers.items()}
        return {name: await anyio.to_thread.run_sync(f.result) for name, f in futures.items()}

    # ---- delayed_batching="auto": the throughput model (autobatch/controller.py) ------------
    async def profile(self, refresh: bool = False) -> dict[str, LatencyProfile]:
        """Each model's step-latency profile (`autobatch/latency_profile.py`): read from the cache
        under the store home (`profiles/<key>.json`), else measured now in the worker's own
        thread, between its steps, one model at a time, and cached. `refresh=True` measures again."""
        if not self._models.workers:
            raise EngineNotRunningError(NOT_RUNNING)
        return await self._profiling.measure(self._models.workers, refresh)

    def throughput_prediction(self, refresh: bool = False) -> ThroughputPrediction | None:
        """With delayed_batching="auto": the throughput model's current choice of B per model and
        what it predicts (tokens/s, per-token latency, the routing statistics and step-latency
        models it used). `refresh=True` re-picks B now from what has been observed so far.
        None without "auto", or before the engine has started."""
        return self._profiling.prediction(retune=refresh and bool(self._models.workers))
