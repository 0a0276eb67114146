"""One model's serving state and its step: scheduler, KV pool, runner, the step's logits, and the
policy's routing and verification.

`ModelCore` has no thread and no lock. The thread that steps it (its `WorkerThread`, or the
lockstep driver) calls every method; each method that changes a request's course writes what
must go out into an `Outbox` (engine/outbox.py), which the thread delivers.

The step reads top to bottom: schedule, run, process the logits and sample (engine/step_logits.py),
verify a verifier's checks (engine/verify.py), route and apply (engine/handoff.py). `Routing` and
`Verification` are given the parts of the core they work on (the requests it holds, its counters,
its KV pool), never the core itself, so calls go one way: down from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..config import ModelSpec, SamplingParams
from ..errors import ConfigError
from ..policies import HIDDEN, TOKEN_EMBEDDING, PeerMessage, Policy
from ..sampling import argmax
from ..structured import MAX_ROLLBACK
from .attention import attention_choice, make_attention_backend
from .core_stats import CoreCounters, CoreStats
from .handoff import Routing
from .held_requests import HeldRequests
from .kv import BlockManager, KVCache, KVLayout
from .model import ForwardOutput, LoadedModel, ModelRunner, load_model
from .outbox import Outbox, WorkerEvent
from .role import Role
from .sched import ScheduledBatch, Scheduler
from .sequence import Request, SeqStatus, Sequence
from .step_logits import StepLogits
from .stop_rule import StopRule
from .verify import Verification

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_TOKENS = 16384


@dataclass
class Runtime:
    """What serving a loaded model needs: its KV pool, the pool's accounting, a scheduler, and
    a runner over the chosen attention backend."""

    cache: KVCache
    blocks: BlockManager
    scheduler: Scheduler
    runner: ModelRunner
    attention_backend: str  # "torch", "cpu" or "flashinfer"
    attention_fallback: str | None = None  # why "auto" runs torch's backend on CUDA (engine/attention/choice.py)


def build_runtime(
    name: str, spec: ModelSpec, loaded: LoadedModel, capture_hidden: bool, compute: Callable | None, threads: int | None
) -> Runtime:
    """Size the KV pool from the spec's budget, choose the attention backend, and make the runner
    (with CUDA graphs of decode steps where flashinfer serves)."""
    layout = KVLayout.from_config(loaded.model.config, loaded.kv)
    tokens = spec.kv_cache_tokens
    if tokens is None and spec.kv_cache_bytes is None:
        tokens = DEFAULT_KV_CACHE_TOKENS
    num_blocks = KVCache.num_blocks_for(layout, spec.block_size, tokens, spec.kv_cache_bytes)
    if num_blocks < 1:
        raise ConfigError(
            f"model {name!r}: the KV budget is smaller than one block of {spec.block_size} tokens "
            f"({spec.block_size * layout.bytes_per_token} bytes)"
        )
    choice = attention_choice(spec, loaded.device, loaded.dtype, layout.head_dim, loaded.kv)
    # flashinfer's self-test, and CUDA graphs' padded rows, write one extra block, no request's
    scratch = 1 if choice.name == "flashinfer" else 0
    cache = KVCache(layout, num_blocks + scratch, spec.block_size, loaded.device)
    blocks = BlockManager(num_blocks, spec.block_size, spec.enable_prefix_caching)
    heads = loaded.model.config.get_text_config().num_attention_heads
    backend, choice = make_attention_backend(spec, choice, cache, heads, loaded.device, scratch_block=num_blocks)
    runner = ModelRunner(loaded, backend, spec.block_size, capture_hidden, compute, threads)
    graph_batch = min(spec.cuda_graph_max_batch, spec.max_num_seqs) if choice.name == "flashinfer" else 0
    if graph_batch:
        runner.capture_graphs(graph_batch, scratch_block=num_blocks)
    scheduler = Scheduler(blocks, spec.max_num_seqs, spec.max_num_batched_tokens)
    return Runtime(cache, blocks, scheduler, runner, choice.name, choice.fallback)


class ModelCore:
    def __init__(self, name: str, spec: ModelSpec, policy: Policy, keep_kv_on_handoff: bool = True):
        self.name = name
        self.spec = spec
        self.policy = policy
        self._role = Role.in_policy(name, policy)
        # False is the "standard serving" baseline: a hand-off frees this worker's KV and goes back
        # to the caller, who sends the whole sequence to the peer as a new request (re-prefill).
        self._keep_kv_on_handoff = keep_kv_on_handoff
        self.seqs: dict[str, Sequence] = {}
        self.counters = CoreCounters()
        # a verifier's grammar matchers roll back a whole check
        depth = max(MAX_ROLLBACK, policy.max_draft + 1) if self._role.verifier_index is not None else MAX_ROLLBACK
        self._logits = StepLogits(name, depth)
        self.loaded: LoadedModel | None = None  # the rest is set by load()
        self.runner: ModelRunner | None = None
        self.cache: KVCache | None = None
        self.blocks: BlockManager | None = None
        self.scheduler: Scheduler | None = None
        self.attention_backend = ""  # "torch", "cpu" or "flashinfer", chosen at load
        self.attention_fallback: str | None = None  # why "auto" runs torch's backend on CUDA, if it does
        self.torch_threads: int | None = None  # torch threads its forwards run on
        self._held: HeldRequests | None = None  # the requests in seqs, kept in step with the scheduler
        self._routing: Routing | None = None
        self._verification: Verification | None = None

    # ---- set-up ----------------------------------------------------------------------------
    def load(self, compute: Callable | None = None, forward_threads: int | None = None) -> LoadedModel:
        """Load the model and allocate the KV pool, in the thread that will step this core.
        `compute` runs each forward elsewhere (the shared CPU compute thread), on `forward_threads`."""
        loaded = load_model(self.name, self.spec, forward_threads)
        capture = self._role.routes and HIDDEN in self.policy.requires
        rt = build_runtime(self.name, self.spec, loaded, capture, compute, forward_threads)
        self.cache, self.blocks, self.scheduler, self.runner = rt.cache, rt.blocks, rt.scheduler, rt.runner
        self.attention_backend = rt.attention_backend
        self.attention_fallback = rt.attention_fallback
        self.torch_threads = forward_threads
        self.loaded = loaded
        self._held = held = HeldRequests(self.name, self.seqs, rt.scheduler)
        stop_rule = StopRule(frozenset(loaded.eos_token_ids))
        embedding = loaded.model.get_input_embeddings() if TOKEN_EMBEDDING in self.policy.requires else None
        self._verification = Verification(
            self._role, self.policy, held, self._logits, rt.blocks, rt.cache, stop_rule, self.counters
        )
        check = self._verification.check  # a verifier's own proposals go to it
        self._routing = Routing(
            self._role, self.policy, held, self.counters, stop_rule, embedding, self._keep_kv_on_handoff, check
        )
        return loaded

    @property
    def model_forward(self) -> str:
        """Which forward serves ("fused", or "transformers: " and why not); "" before loading."""
        return self.runner.forward_kind if self.runner is not None else ""

    @property
    def cuda_graph_sizes(self) -> list[int]:
        """Decode batch sizes replayed from CUDA graphs (none on CPU, or if capture failed)."""
        return self.runner.graph_sizes if self.runner is not None else []

    @property
    def num_ready(self) -> int:
        return self.scheduler.num_ready

    # ---- what arrives ----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """A new request from the caller (this is its entry model: it scores the prompt, if asked)."""
        seq = Sequence(req, token_ids=list(req.prompt_ids), num_confirmed=len(req.prompt_ids))
        if req.params.prompt_logprobs is not None:
            seq.prompt_logprobs = []
        self._held.admit(seq)

    def receive(
        self, msg: PeerMessage, req: Request, out: Outbox, refuse: bool = False, error: str | None = None
    ) -> None:
        """A request arrives from a peer: take the suffix, then catch up (or prefill if new here).
        `refuse`: the worker is stopping, so the request ends here instead: with `error` when the
        worker died (as the requests it held end), else as aborted."""
        self.counters.handoffs_received += 1
        seq = self.seqs.get(msg.request_id)
        if req.aborted or refuse:  # aborted in transit: end it here
            failed = refuse and error is not None and not req.aborted
            reason, error = ("error", error) if failed else ("abort", None)
            return self._end_arrival(seq, req.request_id, reason, error, out)
        held = len(seq.token_ids) if seq is not None else 0
        if seq is not None and msg.start < held and self._role.verifier_index is not None:
            held = self._verification.supersede(seq, msg)  # a message is authoritative from its start
        if not msg.start <= held <= msg.start + len(msg.tokens):  # a gap, or the sender knows less than us
            error = (
                f"hand-off from {msg.source!r} carries tokens [{msg.start}, {msg.start + len(msg.tokens)}) "
                f"but {self.name!r} holds {held}"
            )
            return self._end_arrival(seq, req.request_id, "error", error, out)
        # With three or more models a third one may have sent us part of the suffix already.
        new_tokens = msg.tokens[held - msg.start :]
        if seq is None:
            seq = Sequence(req, token_ids=list(new_tokens))
            self.policy.receive(msg, seq.policy_state)
            self._held.admit(seq)
        else:
            seq.token_ids.extend(new_tokens)
            self.policy.receive(msg, seq.policy_state)
            self.scheduler.resume(seq)
        seq.num_confirmed = max(seq.num_confirmed, min(msg.confirmed, len(seq.token_ids)))
        if msg.logprobs or seq.draft_logprobs:  # the drafters' records of what is still tentative
            merged = {**seq.draft_logprobs, **{p: r for p, r in msg.logprobs.items() if p >= held}}
            seq.draft_logprobs = {p: r for p, r in merged.items() if p >= seq.num_confirmed}
        if self._role.verifies and len(seq.token_ids) > seq.num_confirmed:
            self._verification.check(seq, msg.source)
        seq.peer_known[msg.source] = len(seq.token_ids)
        seq.stalls = msg.stalls
        self.counters.catchups += 1
        self.counters.catchup_tokens += seq.num_uncomputed

    def _end_arrival(self, seq: Sequence | None, request_id: str, reason: str, error: str | None, out: Outbox) -> None:
        """A hand-off that ends on arrival (aborted in transit, refused, or inconsistent)."""
        if seq is not None:
            self._held.drop(seq)
        out.events.append(WorkerEvent(request_id, [], self.name, finish_reason=reason, error=error))
        out.releases.append(request_id)

    def abort(self, request_id: str, out: Outbox) -> None:
        """The caller ends a request: the owner reports its end, a pending copy just goes."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            owner = seq.status is not SeqStatus.PENDING
            self._held.drop(seq)
            if owner:
                out.events.append(self._held.event(seq, finish_reason="abort"))

    def release(self, request_id: str) -> None:
        """Drop the pending copy of a request that ended elsewhere."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._held.drop(seq)

    def end_request(self, request_id: str, reason: str, error: str | None, out: Outbox) -> None:
        """End a request here and everywhere (a hand-off its peer refused)."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._held.end(seq, out, reason, error)
        else:
            out.events.append(WorkerEvent(request_id, [], self.name, finish_reason=reason, error=error))

    def end_all(self, reason: str, error: str | None, out: Outbox) -> None:
        """End every request this core owns, and drop its pending copies (the owner ends those)."""
        if self._held is not None:  # None: the model never loaded, so it holds nothing
            self._held.end_all(out, reason, error)

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> Outbox:
        """One step: schedule, run, sample, verify, route, apply."""
        t_start = time.perf_counter()
        out = Outbox()
        batch, failed = self.scheduler.schedule()
        for seq, exc in failed:
            self._held.end(seq, out, "error", str(exc))
        if batch is not None:
            try:
                self._run_and_apply(batch, out)
            except Exception as e:  # a failed forward fails its batch, not the worker
                log.exception("model %r: step failed", self.name)
                msg = f"model {self.name!r} step failed: {type(e).__name__}: {e}"
                for seq in batch.seqs:
                    if self.seqs.get(seq.request_id) is seq and seq.status is not SeqStatus.PENDING:
                        self._held.end(seq, out, "error", msg)
        self.counters.time_step += time.perf_counter() - t_start
        return out

    def _run_and_apply(self, batch: ScheduledBatch, out: Outbox) -> None:
        forward = self._run(batch)
        if forward.prompt:
            self._logits.score_prompts(batch, forward.prompt)
        seqs = [batch.seqs[r] for r in forward.sample_rows]
        if not seqs:
            return
        logits, hidden = self._logits.process(seqs, forward.logits), forward.hidden
        sampled = self._logits.sample(seqs, logits)
        if forward.verify:  # a verifier's checks: accept, roll back, write the next position
            v = self._verification.run(forward, seqs, sampled, logits, out)
            seqs, sampled, logits, hidden = v.seqs, v.tokens, v.logits, v.hidden
        records = self._logits.token_logprobs(seqs, logits, sampled)
        decision = self._routing.decide(seqs, logits, hidden, sampled, out)
        if decision is not None:
            self._routing.apply(seqs, sampled.tolist(), records, *decision, out)

    def _run(self, batch: ScheduledBatch) -> ForwardOutput:
        """The forward, and what it computed: each row's new tokens now hold KV here."""
        fwd = self.runner.forward(batch)
        c = self.counters
        c.time_forward += fwd.model_time
        c.steps += 1
        c.batch_sizes[len(batch)] += 1
        c.steps_by_threads[fwd.threads] += 1
        c.rows_stepped += len(batch)
        for seq, n in zip(batch.seqs, batch.num_new):
            seq.num_computed += n
            seq.num_fed += n
            self.blocks.register_full_blocks(seq)
        n_tokens = sum(batch.num_new)
        c.tokens_processed += n_tokens
        c.step_tokens[n_tokens] = c.step_tokens.get(n_tokens, 0) + 1
        return fwd

    # ---- reports ---------------------------------------------------------------------------
    def stats(self) -> CoreStats:
        c = self.counters
        return CoreStats(
            model=self.name,
            **vars(self.blocks.stats()),
            kv_cache_bytes=self.cache.nbytes,
            **vars(self.scheduler.stats()),
            steps=c.steps,
            tokens_processed=c.tokens_processed,
            handoffs_received=c.handoffs_received,
            handoffs_sent=c.handoffs_sent,
            batch_size_histogram=dict(sorted(c.batch_sizes.items())),
            time_forward_s=c.time_forward,
            time_step_s=c.time_step,
            attention_backend=self.attention_backend,
            cuda_graph_batch_sizes=self.cuda_graph_sizes,
            attention_fallback=self.attention_fallback,
            cuda_graph_error=self.runner.graph_error,
            model_forward=self.model_forward,
            torch_threads=self.torch_threads,
            steps_by_threads=dict(c.steps_by_threads),
            proposed_tokens=c.proposed_tokens,
            proposed_accepted=c.proposed_accepted,
        )

    def profile_step(self, rows: int, tokens_each: int = 1, catch_up: int = 0, context: int = 64) -> float:
        """Seconds of one forward over synthetic requests, each with `context` tokens in the KV
        cache: `rows` rows of `tokens_each` new tokens (1: decodes; more: a verifier's checks,
        keeping logits from the first), plus one catch-up row of `catch_up` tokens. Runs between
        steps, in the stepping thread (autobatch/latency_profile.py measures a grid of these);
        the blocks it takes are free again when it returns."""
        vocab, made = self.loaded.vocab_size, []
        params = SamplingParams(temperature=0.0, max_tokens=1)
        news = [tokens_each] * rows + ([catch_up] if catch_up else [])
        try:
            for i, n in enumerate(news):
                ids = [(7 * i + 13 * j + 3) % vocab for j in range(context + n)]
                req = Request(f"__profile_{i}", ids, params, seed=0, stop_token_ids=frozenset(), max_tokens=1)
                seq = Sequence(req, token_ids=ids, status=SeqStatus.RUNNING, num_computed=context)
                made.append(seq)
                if not self.blocks.grow(seq, context + n):
                    raise RuntimeError(f"model {self.name!r}: KV blocks ran out while profiling")
                seq.verify_start = context + 1 if n > 1 and i < rows else None
            batch = ScheduledBatch(seqs=made, num_new=news, num_decode=rows if tokens_each == 1 else 0)
            t0 = time.perf_counter()
            out = self.runner.forward(batch)
            argmax(out.logits).tolist()  # waits for the device, like a real step's sampling
            return time.perf_counter() - t0
        finally:
            for seq in made:
                self.blocks.free(seq)

    def routing_counters(self) -> dict[str, float | dict[int, int]]:
        """Counters the throughput model reads."""
        return self.counters.routing()
