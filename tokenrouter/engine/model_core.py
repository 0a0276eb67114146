"""One model's serving state and its step: scheduler, KV pool, runner, sampler and the policy.

`ModelCore` has no thread and no lock. The thread that steps it (its `WorkerThread`, or the
lockstep driver) calls every method; each method that changes a request's course writes what
must go out into an `Outbox`: events for the caller, hand-offs for peers, and the requests whose
pending copies the peers must drop. The thread delivers it.

After each step the policy routes the batch; a request that moves is parked here as pending,
with its KV blocks kept, and its hand-off carries the suffix the peer has not seen.

Every per-request change to the logits (penalties; a grammar's mask belongs there too) happens in
`_process_logits`, before the sampler, the policy's `route` and `verify`, and the logprobs read
them (docs/sampling.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import ModelSpec
from ..errors import ConfigError
from ..policies.base import (
    ENTROPY,
    HIDDEN,
    TOKEN_EMBEDDING,
    PeerMessage,
    Policy,
    StepResult,
    Verdict,
    VerifyResult,
    normalized_entropy,
)
from ..sampling.logprobs import token_logprobs
from ..sampling.penalties import penalize_rows
from ..sampling.sampler import Sampler, SamplingTensors
from ..structured.matcher import MAX_ROLLBACK, GrammarState, allocate, apply_bitmask
from .attention.choice import choose_attention_backend
from .attention.torch_paged import TorchPagedAttention
from .kv.block_manager import BlockManager
from .kv.cache import KVCache, KVLayout
from .model.loader import LoadedModel, load_model
from .model.runner import ForwardOutput, ModelRunner
from .sched.batch import ScheduledBatch
from .sched.scheduler import Scheduler
from .sequence import Request, SeqStatus, Sequence
from .worker.events import WorkerEvent

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_TOKENS = 16384
MAX_STALLS = 8  # hand-offs in a row without a new token before a request is failed


@dataclass
class PeerHandOff:
    """A request leaving for a peer: the message (the suffix the peer has not seen) and the request."""

    target: str
    msg: PeerMessage
    req: Request


@dataclass
class Outbox:
    """What one call into a `ModelCore` must send out, in this order: releases to every peer,
    events to the caller, then hand-offs (a peer's tokens must never reach the caller before ours)."""

    events: list[WorkerEvent] = field(default_factory=list)
    handoffs: list[PeerHandOff] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)  # request ids whose pending copies peers drop


@dataclass
class CoreCounters:
    """What a core has done; plain ints and floats, read from any thread without a lock."""

    steps: int = 0
    tokens_processed: int = 0
    handoffs_received: int = 0
    handoffs_sent: int = 0
    time_forward: float = 0.0
    time_step: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)
    steps_by_threads: Counter = field(default_factory=Counter)
    # what the throughput model observes (delayed_batching="auto")
    rows_stepped: int = 0  # sum of batch sizes over steps
    rows_sampled: int = 0  # tokens sampled (rows whose last token was computed)
    tokens_kept: int = 0  # sampled tokens the policy kept
    catchups: int = 0  # requests arrived from a peer
    catchup_tokens: int = 0  # tokens they needed computed on arrival
    step_tokens: dict[int, int] = field(default_factory=dict)  # steps by the tokens they computed (copy() is atomic)


class ModelCore:
    def __init__(self, name: str, spec: ModelSpec, policy: Policy, keep_kv_on_handoff: bool = True):
        self.name = name
        self.spec = spec
        self.policy = policy
        self.routing = name in policy.models and len(policy.models) > 1
        self.model_index = policy.models.index(name) if name in policy.models else -1
        # verifying policies (policies/base.py): the verifier checks what the other models wrote,
        # which stays tentative until then; this core either verifies or drafts
        verifier = policy.verifier if self.routing else None
        self.verifier_index = policy.models.index(verifier) if verifier is not None else None
        self.verifies = verifier == name
        self.drafts = verifier is not None and not self.verifies
        # False is the "standard serving" baseline: a hand-off frees this worker's KV and goes back
        # to the caller, who sends the whole sequence to the peer as a new request (re-prefill).
        self.keep_kv_on_handoff = keep_kv_on_handoff
        self.seqs: dict[str, Sequence] = {}
        self.counters = CoreCounters()
        self.loaded: LoadedModel | None = None  # set by load()
        self.runner: ModelRunner | None = None
        self.cache: KVCache | None = None
        self.blocks: BlockManager | None = None
        self.scheduler: Scheduler | None = None
        self.sampler = Sampler()
        self.attention_backend = ""  # "torch" or "flashinfer", chosen at load
        self.torch_threads: int | None = None  # torch threads its forwards run on

    # ---- set-up ----------------------------------------------------------------------------
    def load(self, compute: Callable | None = None, forward_threads: int | None = None) -> LoadedModel:
        """Load the model and allocate the KV pool, in the thread that will step this core.
        `compute` runs each forward elsewhere (the shared CPU compute thread), on `forward_threads`."""
        spec = self.spec
        loaded = load_model(self.name, spec)
        layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
        tokens = spec.kv_cache_tokens
        if tokens is None and spec.kv_cache_bytes is None:
            tokens = DEFAULT_KV_CACHE_TOKENS
        num_blocks = KVCache.num_blocks_for(layout, spec.block_size, tokens, spec.kv_cache_bytes)
        if num_blocks < 1:
            raise ConfigError(
                f"model {self.name!r}: the KV budget is smaller than one block of {spec.block_size} tokens "
                f"({spec.block_size * layout.bytes_per_token} bytes)"
            )
        self.attention_backend = choose_attention_backend(spec, loaded.device, loaded.dtype, layout.head_dim)
        graph_batch = 0
        if self.attention_backend == "flashinfer":
            graph_batch = min(spec.cuda_graph_max_batch, spec.max_num_seqs)
        # CUDA graphs pad decode steps with rows that write one extra block, no request's
        self.cache = KVCache(layout, num_blocks + (1 if graph_batch else 0), spec.block_size, loaded.device)
        self.blocks = BlockManager(num_blocks, spec.block_size, spec.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, spec.max_num_seqs, spec.max_num_batched_tokens)
        if self.attention_backend == "flashinfer":
            from .attention.flashinfer_paged import FlashInferPagedAttention

            heads = loaded.model.config.get_text_config().num_attention_heads
            backend = FlashInferPagedAttention(self.cache, heads, loaded.device)
        else:
            backend = TorchPagedAttention(self.cache)
        capture = self.routing and HIDDEN in self.policy.requires
        self.runner = ModelRunner(loaded, backend, spec.block_size, capture, compute, forward_threads)
        if graph_batch:
            self.runner.capture_graphs(graph_batch, scratch_block=num_blocks)
        self.torch_threads = forward_threads
        self.loaded = loaded
        return loaded

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
        self._admit(seq)

    def receive(
        self, msg: PeerMessage, req: Request, out: Outbox, refuse: bool = False, error: str | None = None
    ) -> None:
        """A request arrives from a peer: take the suffix, then catch up (or prefill if new here).
        `refuse`: the worker is stopping, so the request ends here instead: with `error` when the
        worker died (as the requests it held end), else as aborted."""
        self.counters.handoffs_received += 1
        seq = self.seqs.get(msg.request_id)
        if req.aborted or refuse:  # aborted in transit: end it here
            if seq is not None:
                self._release(seq)
            failed = refuse and error is not None and not req.aborted
            reason = "error" if failed else "abort"
            out.events.append(
                WorkerEvent(req.request_id, [], self.name, finish_reason=reason, error=error if failed else None)
            )
            out.releases.append(req.request_id)
            return
        held = len(seq.token_ids) if seq is not None else 0
        if seq is not None and msg.start < held and self.verifier_index is not None:
            held = self._supersede(seq, msg)  # a message is authoritative from its start: drop what it rolled back
        if not msg.start <= held <= msg.start + len(msg.tokens):  # a gap, or the sender knows less than us
            error = (
                f"hand-off from {msg.source!r} carries tokens [{msg.start}, {msg.start + len(msg.tokens)}) "
                f"but {self.name!r} holds {held}"
            )
            if seq is not None:
                self._release(seq)
            out.events.append(WorkerEvent(req.request_id, [], self.name, finish_reason="error", error=error))
            out.releases.append(req.request_id)
            return
        # With three or more models a third one may have sent us part of the suffix already.
        new_tokens = msg.tokens[held - msg.start :]
        if seq is None:
            seq = Sequence(req, token_ids=list(new_tokens))
            self.policy.receive(msg, seq.policy_state)
            self._admit(seq)
        else:
            seq.token_ids.extend(new_tokens)
            self.policy.receive(msg, seq.policy_state)
            self.scheduler.resume(seq)
        seq.num_confirmed = max(seq.num_confirmed, min(msg.confirmed, len(seq.token_ids)))
        if msg.logprobs or seq.draft_logprobs:  # the drafters' records of what is still tentative
            merged = {**seq.draft_logprobs, **{p: r for p, r in msg.logprobs.items() if p >= held}}
            seq.draft_logprobs = {p: r for p, r in merged.items() if p >= seq.num_confirmed}
        if self.verifies and len(seq.token_ids) > seq.num_confirmed:
            self._check(seq, msg.source)
        seq.peer_known[msg.source] = len(seq.token_ids)
        seq.stalls = msg.stalls
        self.counters.catchups += 1
        self.counters.catchup_tokens += seq.num_uncomputed

    def _supersede(self, seq: Sequence, msg: PeerMessage) -> int:
        """Under a verifying policy a message replaces what we hold from its start on: keep the
        tokens it agrees with, roll the rest back (a rejected draft). Returns the tokens kept."""
        ours = seq.token_ids[msg.start :]
        same = next((i for i, (a, b) in enumerate(zip(ours, msg.tokens)) if a != b), min(len(ours), len(msg.tokens)))
        keep = msg.start + same
        if keep < len(seq.token_ids):
            self._rollback(seq, keep)
        return keep

    def _check(self, seq: Sequence, source: str) -> None:
        """The tokens from seq.num_confirmed on are tentative: the next forward that reaches the
        end computes the verifier's logits over them (from the position before the first)."""
        seq.verify_start, seq.verify_source = seq.num_confirmed, source
        if seq.num_computed > seq.verify_start - 1:  # that position's logits are not computed again otherwise
            self.cache.copy_blocks(self.blocks.truncate(seq, seq.verify_start - 1))

    def _rollback(self, seq: Sequence, n: int) -> None:
        """Keep the first n tokens: the rest, and their KV, go (the KV's blocks copied on write
        where the prefix cache or another request holds them); peers are told again from there."""
        del seq.token_ids[n:]
        if seq.grammar is not None:
            seq.grammar.truncate(n, seq.token_ids)
        if seq.draft_logprobs:
            seq.draft_logprobs = {p: r for p, r in seq.draft_logprobs.items() if p < n}
        self.cache.copy_blocks(self.blocks.truncate(seq, min(seq.num_computed, n)))
        for peer in seq.peer_known:
            seq.peer_known[peer] = min(seq.peer_known[peer], n)
        seq.num_confirmed = min(seq.num_confirmed, n)

    def abort(self, request_id: str, out: Outbox) -> None:
        """The caller ends a request: the owner reports its end, a pending copy just goes."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            owner = seq.status is not SeqStatus.PENDING
            self._release(seq)
            if owner:
                out.events.append(self._event(seq, finish_reason="abort"))

    def release(self, request_id: str) -> None:
        """Drop the pending copy of a request that ended elsewhere."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._release(seq)

    def end_request(self, request_id: str, reason: str, error: str | None, out: Outbox) -> None:
        """End a request here and everywhere (a hand-off its peer refused)."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._end(seq, out, reason, error)
        else:
            out.events.append(WorkerEvent(request_id, [], self.name, finish_reason=reason, error=error))

    def end_all(self, reason: str, error: str | None, out: Outbox) -> None:
        """End every request this core owns, and drop its pending copies (the owner ends those)."""
        for seq in list(self.seqs.values()):
            owner = seq.status is not SeqStatus.PENDING
            self.scheduler.remove(seq)
            if owner:
                out.releases.append(seq.request_id)  # free its pending copies on the other workers
                out.events.append(self._event(seq, finish_reason=reason, error=error))
        self.seqs.clear()

    # ---- the step --------------------------------------------------------------------------
    def step(self) -> Outbox:
        """One step: schedule, run, sample, route, apply."""
        t_start = time.perf_counter()
        out = Outbox()
        batch, failed = self.scheduler.schedule()
        for seq, exc in failed:
            self._end(seq, out, "error", str(exc))
        if batch is not None:
            try:
                forward = self._run(batch)
                if forward.prompt:
                    self._score_prompts(batch, forward.prompt)
                seqs = [batch.seqs[r] for r in forward.sample_rows]
                if seqs:
                    logits, hidden = self._process_logits(seqs, forward.logits), forward.hidden
                    sampled = self._sample(seqs, logits)
                    if forward.verify:  # a verifier's checks: accept, roll back, write the next position
                        seqs, sampled, logits, hidden = self._verify(forward, seqs, sampled, logits, out)
                    records = self._token_logprobs(seqs, logits, sampled)
                    decision = self._route(seqs, logits, hidden, sampled, out)
                    if decision is not None:
                        self._apply(seqs, sampled.tolist(), records, *decision, out)
            except Exception as e:  # a failed forward fails its batch, not the worker
                log.exception("model %r: step failed", self.name)
                msg = f"model {self.name!r} step failed: {type(e).__name__}: {e}"
                for seq in batch.seqs:
                    if self.seqs.get(seq.request_id) is seq and seq.status is not SeqStatus.PENDING:
                        self._end(seq, out, "error", msg)
        self.counters.time_step += time.perf_counter() - t_start
        return out

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

    # ---- logits: processing, sampling, logprobs ----------------------------------------------
    @staticmethod
    def _processes(seq: Sequence) -> bool:
        """Whether `_process_logits` changes this request's logits (penalties, a grammar)."""
        return seq.req.params.penalized or seq.req.grammar is not None

    def _process_logits(
        self, seqs: list[Sequence], logits: torch.Tensor, lengths: list[int] | None = None
    ) -> torch.Tensor:
        """The one place where a request's logits are changed, before anything reads them: the
        sampler, `route`, `verify` and the logprobs. Row r holds seqs[r]'s next-token logits after
        its first lengths[r] tokens (default: all it holds; a check's rows, one per position, each
        count only what precedes them). First the penalties (sampling/penalties.py), then a
        grammar's mask (structured/matcher.py: the row's matcher moved to that position, -inf
        where the grammar forbids). Rows that ask for nothing are left bit for bit, and when none
        asks the tensor itself comes back."""
        rows = [r for r, s in enumerate(seqs) if self._processes(s)]
        if not rows:
            return logits
        if lengths is None:
            lengths = [len(s.token_ids) for s in seqs]
        penalized = [r for r in rows if seqs[r].req.params.penalized]
        if penalized:
            chosen = [seqs[r] for r in penalized]
            index = torch.tensor(penalized, device=logits.device)
            rows_out = penalize_rows(
                logits.index_select(0, index),
                [s.token_ids for s in chosen],
                [s.req.num_prompt_tokens for s in chosen],
                [lengths[r] for r in penalized],
                [s.req.params for s in chosen],
            )
            logits = logits.index_copy(0, index, rows_out)
        else:
            logits = logits.clone()
        constrained = [r for r in rows if seqs[r].req.grammar is not None]
        if constrained:
            bitmask = allocate(len(constrained), logits.shape[-1])
            for j, r in enumerate(constrained):
                state = self._grammar_state(seqs[r])
                state.seek(lengths[r], seqs[r].token_ids)
                state.fill(bitmask, j)
            apply_bitmask(logits, constrained, bitmask)
        return logits

    def _process_spans(self, seqs: list[Sequence], spans: list[torch.Tensor]) -> list[torch.Tensor]:
        """A verifier's checks through `_process_logits`: span row j of a check is the position
        after the check's first verify_start + j tokens (so `Speculative` stays lossless against
        the penalized or constrained target: a draft the grammar forbids is rejected)."""
        if not any(self._processes(s) for s in seqs):
            return spans
        sizes = [span.shape[0] for span in spans]
        rows = [s for s, n in zip(seqs, sizes) for _ in range(n)]
        lengths = [s.verify_start + j for s, n in zip(seqs, sizes) for j in range(n)]
        return list(self._process_logits(rows, torch.cat(spans), lengths).split(sizes))

    def _grammar_state(self, seq: Sequence) -> GrammarState:
        if seq.grammar is None:
            depth = MAX_ROLLBACK if self.verifier_index is None else max(MAX_ROLLBACK, self.policy.max_draft + 1)
            seq.grammar = GrammarState(seq.req.grammar, seq.req.num_prompt_tokens, depth)
        return seq.grammar

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        if all(s.req.params.temperature == 0.0 for s in seqs):  # all greedy: no sampling tensors needed
            return logits.argmax(dim=-1)
        return self.sampler(logits, self._sampling_tensors(seqs, logits.device))

    @staticmethod
    def _sampling_tensors(seqs: list[Sequence], device) -> SamplingTensors:
        return SamplingTensors.build(
            [s.req.params for s in seqs], [s.req.seed for s in seqs], [s.num_generated for s in seqs], device
        )

    def _token_logprobs(self, seqs: list[Sequence], logits: torch.Tensor, tokens: torch.Tensor) -> list | None:
        """Per row, the written token's `TokenLogprob` under this model (None for rows that do not
        ask; None for all when none asks): from the processed logits it was drawn from."""
        rows = [r for r, s in enumerate(seqs) if s.req.params.logprobs is not None]
        if not rows:
            return None
        chosen = [seqs[r] for r in rows]
        index = torch.tensor(rows, device=logits.device)
        lp = self.sampler.logprobs(logits.index_select(0, index), self._sampling_tensors(chosen, logits.device))
        found = token_logprobs(lp, tokens[index.to(tokens.device)], [s.req.params.logprobs for s in chosen], self.name)
        records: list = [None] * len(seqs)
        for r, record in zip(rows, found):
            records[r] = record
        return records

    def _score_prompts(self, batch: ScheduledBatch, prompt: dict[int, tuple[int, torch.Tensor]]) -> None:
        """prompt_logprobs: the scored prompt positions' records, from the model's own logits (no
        penalty, no temperature: a prompt token was not sampled), appended to each sequence's."""
        rows = list(prompt)
        seqs = [batch.seqs[r] for r in rows]
        logits = torch.cat([prompt[r][1] for r in rows])
        lp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        spans = [(prompt[r][0], prompt[r][1].shape[0]) for r in rows]
        targets = [t for s, (first, n) in zip(seqs, spans) for t in s.token_ids[first + 1 : first + 1 + n]]
        num_top = [s.req.params.prompt_logprobs for s, (_, n) in zip(seqs, spans) for _ in range(n)]
        records = token_logprobs(lp, torch.tensor(targets), num_top, self.name)
        done = 0
        for s, (first, n) in zip(seqs, spans):
            assert first == len(s.prompt_logprobs), "prompt positions are scored in order (no cache hits before)"
            s.prompt_logprobs.extend(records[done : done + n])
            done += n

    def _route(
        self, seqs: list[Sequence], logits: torch.Tensor, hidden, sampled: torch.Tensor, out: Outbox
    ) -> tuple[list | None, list | None] | None:
        """The policy's decision per row (keep the token? which model next?); (None, None) when
        not routing; None when the policy raised, which fails the requests of this call only."""
        if self.routing:
            try:
                keep, next_model = self._policy_route(seqs, logits, hidden, sampled)
            except Exception as e:
                log.exception("model %r: policy.route failed", self.name)
                msg = f"policy {type(self.policy).__name__}.route failed: {type(e).__name__}: {e}"
                for seq in seqs:
                    self._end(seq, out, "error", msg)
                return None
        else:
            keep, next_model = None, None
        self.counters.rows_sampled += len(seqs)
        self.counters.tokens_kept += len(seqs) if keep is None else sum(map(bool, keep))
        return keep, next_model

    def _policy_route(
        self, seqs: list[Sequence], logits: torch.Tensor, hidden, sampled: torch.Tensor
    ) -> tuple[list, list]:
        requires = self.policy.requires
        result = StepResult(
            model=self.name,
            model_index=self.model_index,
            request_ids=[s.request_id for s in seqs],
            tokens=sampled,
            logits=logits,
            num_generated=torch.tensor([s.num_generated for s in seqs]),
            states=[s.policy_state for s in seqs],
            entropy=normalized_entropy(logits) if ENTROPY in requires else None,
            hidden=hidden,
            token_embedding=self.loaded.model.get_input_embeddings()(sampled) if TOKEN_EMBEDDING in requires else None,
            params=[s.req.params for s in seqs],
            seeds=[s.req.seed for s in seqs],
            tentative=torch.tensor([len(s.token_ids) + 1 - s.num_confirmed for s in seqs]) if self.drafts else None,
        )
        decision = self.policy.route(result)
        n = len(seqs)
        if decision.keep.shape != (n,) or decision.next_model.shape != (n,):
            raise ValueError(
                f"route returned shapes {tuple(decision.keep.shape)}, {tuple(decision.next_model.shape)}; "
                f"expected ({n},)"
            )
        next_model = decision.next_model.tolist()
        if any(not 0 <= m < len(self.policy.models) for m in next_model):
            raise ValueError(f"route returned a model index outside [0, {len(self.policy.models)})")
        return decision.keep.tolist(), next_model

    def _apply(
        self,
        seqs: list[Sequence],
        tokens: list[int],
        records: list | None,
        keep: list | None,
        next_model: list | None,
        out: Outbox,
    ):
        for i, seq in enumerate(seqs):
            kept = keep is None or keep[i]
            target = self.model_index if next_model is None else next_model[i]
            self._apply_one(seq, tokens[i], kept, target, out, None if records is None else records[i])

    def _apply_one(self, seq: Sequence, token: int, kept: bool, target: int, out: Outbox, record=None) -> None:
        """One request's outcome of a step: append the token (if kept), finish, stay, or hand off.
        A drafter's token is tentative: not reported, and where the request would end (or the
        drafts reach the policy's limit) the verifier takes it and decides. `record` is the
        token's TokenLogprob when the request asks; a tentative token's waits with it."""
        new = [token] if kept else []
        logprobs = [record] if kept and record is not None else None
        if kept:
            seq.token_ids.append(token)
            seq.stalls = 0
            req = seq.req
            stop = (token in self.loaded.eos_token_ids and not req.params.ignore_eos) or token in req.stop_token_ids
            full = seq.num_generated >= req.max_tokens
            if self.drafts:
                if record is not None:
                    seq.draft_logprobs[len(seq.token_ids) - 1] = record
                if stop or full or len(seq.token_ids) - seq.num_confirmed >= self.policy.max_draft:
                    target = self.verifier_index
            else:
                seq.num_confirmed = len(seq.token_ids)
                if stop:
                    return self._end(seq, out, "stop", tokens=new, logprobs=logprobs)
                if full:
                    return self._end(seq, out, "length", tokens=new, logprobs=logprobs)
        reported = [] if self.drafts else new
        if not reported:
            logprobs = None
        if target == self.model_index:
            if not kept:
                return self._end(seq, out, "error", "policy discarded a token without handing the request off")
            if reported:
                out.events.append(self._event(seq, reported, logprobs))
            return
        # Hand off: park here with blocks kept, send the peer the suffix it has not seen.
        if not kept:
            seq.stalls += 1
            if seq.stalls > MAX_STALLS:
                return self._end(seq, out, "error", f"policy handed the request off {seq.stalls} times without a token")
        name = self.policy.models[target]
        ev = self._event(seq, reported, logprobs, handoff_to=name)
        out.events.append(ev)
        known = seq.peer_known.get(name, 0) if self.keep_kv_on_handoff else 0
        msg = PeerMessage(
            seq.request_id,
            self.name,
            name,
            seq.token_ids[known:],
            start=known,
            stalls=seq.stalls,
            confirmed=seq.num_confirmed,
            logprobs={p: r for p, r in seq.draft_logprobs.items() if p >= known},
        )
        try:
            msg = self.policy.send(msg, seq.policy_state)
        except Exception as e:
            return self._end(seq, out, "error", f"policy {type(self.policy).__name__}.send failed: {e}")
        self.counters.handoffs_sent += 1
        if not self.keep_kv_on_handoff:  # standard-serving baseline: free KV, the caller re-sends
            self._release(seq)
            ev.resubmit = msg
            return
        seq.peer_known[name] = len(seq.token_ids)
        self.scheduler.park(seq)
        out.handoffs.append(PeerHandOff(name, msg, seq.req))

    # ---- verification (verifying policies) ---------------------------------------------------
    def _verify(
        self, fwd: ForwardOutput, seqs: list[Sequence], sampled: torch.Tensor, logits: torch.Tensor, out: Outbox
    ):
        """The verifier's checks in this step: the policy accepts a prefix of each request's
        tentative tokens; they are reported (written by their drafter), the rest roll back here
        (and on the drafter when the request returns), and the verifier writes the next position:
        the token the policy gives, else one sampled from its own distribution there. Requests
        that end on an accepted token drop out; the others go on to `route` with the (processed)
        logits of the position they write."""
        checks = [i for i, r in enumerate(fwd.sample_rows) if r in fwd.verify]
        spans = self._process_spans([seqs[i] for i in checks], [fwd.verify[fwd.sample_rows[i]] for i in checks])
        verdict = self._policy_verify([seqs[i] for i in checks], spans)
        logits, tokens = logits.clone(), sampled.clone()
        ended: set[int] = set()
        resample: list[tuple[int, torch.Tensor]] = []
        for j, i in enumerate(checks):
            seq, span = seqs[i], spans[j]
            start, drafts = seq.verify_start, seq.token_ids[seq.verify_start :]
            accept = int(verdict.accept[j])
            source, seq.verify_start, seq.verify_source = seq.verify_source, None, None
            if self._confirm(seq, start, drafts[:accept], source, out):
                ended.add(i)
                continue
            if accept < len(drafts):
                self._rollback(seq, start + accept)
            seq.num_confirmed = len(seq.token_ids)
            logits[i] = span[accept]
            given = -1 if verdict.tokens is None else int(verdict.tokens[j])
            if given >= 0:
                tokens[i] = given
            elif accept < len(drafts):  # the last position's sample stands only when every draft does
                resample.append((i, span[accept]))
        if resample:
            redo = self._sample([seqs[i] for i, _ in resample], torch.stack([row for _, row in resample]))
            for (i, _), t in zip(resample, redo.tolist()):
                tokens[i] = t
        keep = [i for i in range(len(seqs)) if i not in ended]
        hidden = fwd.hidden[keep] if fwd.hidden is not None else None
        return [seqs[i] for i in keep], tokens[keep], logits[keep], hidden

    def _policy_verify(self, seqs: list[Sequence], spans: list[torch.Tensor]) -> Verdict:
        counts = [span.shape[0] - 1 for span in spans]
        width = max(counts)
        drafts = torch.full((len(seqs), width), -1, dtype=torch.long)
        logits = spans[0].new_zeros((len(seqs), width + 1, spans[0].shape[-1]))
        for j, (seq, span) in enumerate(zip(seqs, spans)):
            drafts[j, : counts[j]] = torch.tensor(seq.token_ids[seq.verify_start :])
            logits[j, : counts[j] + 1] = span
        result = VerifyResult(
            model=self.name,
            model_index=self.model_index,
            request_ids=[s.request_id for s in seqs],
            sources=[s.verify_source for s in seqs],
            start=torch.tensor([s.verify_start for s in seqs]),
            num_drafts=torch.tensor(counts),
            drafts=drafts,
            logits=logits,
            num_generated=torch.tensor([s.verify_start - s.req.num_prompt_tokens for s in seqs]),
            states=[s.policy_state for s in seqs],
            params=[s.req.params for s in seqs],
            seeds=[s.req.seed for s in seqs],
        )
        verdict = self.policy.verify(result)
        n = len(seqs)
        if verdict.accept.shape != (n,) or (verdict.tokens is not None and verdict.tokens.shape != (n,)):
            raise ValueError(f"verify returned shapes {tuple(verdict.accept.shape)}; expected ({n},)")
        accept = verdict.accept.tolist()
        if any(not 0 <= a <= c for a, c in zip(accept, counts)):
            raise ValueError("verify accepted a number of drafts outside [0, num_drafts]")
        return verdict

    def _confirm(self, seq: Sequence, start: int, accepted: list[int], source: str, out: Outbox) -> bool:
        """Report accepted tentative tokens as their drafter's (with the drafter's logprobs, when
        asked); True if the request ends on one of them (its EOS, a stop token, or max_tokens),
        which ends it here."""
        req = seq.req
        records = None
        if req.params.logprobs is not None:
            records = [seq.draft_logprobs.pop(start + j) for j in range(len(accepted))]
        for j, token in enumerate(accepted):
            stop = (token in self.loaded.eos_token_ids and not req.params.ignore_eos) or token in req.stop_token_ids
            if stop or start + j + 1 - req.num_prompt_tokens >= req.max_tokens:
                self._release(seq)
                out.releases.append(seq.request_id)
                out.events.append(
                    WorkerEvent(
                        seq.request_id,
                        accepted[: j + 1],
                        source,
                        num_cached_prompt=seq.num_cached_prompt,
                        logprobs=None if records is None else records[: j + 1],
                    )
                )
                out.events.append(self._event(seq, finish_reason="stop" if stop else "length"))
                return True
        if accepted:
            out.events.append(
                WorkerEvent(
                    seq.request_id, list(accepted), source, num_cached_prompt=seq.num_cached_prompt, logprobs=records
                )
            )
        return False

    # ---- bookkeeping -----------------------------------------------------------------------
    def _admit(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)

    def _end(self, seq: Sequence, out: Outbox, reason: str, error: str | None = None, tokens=(), logprobs=None) -> None:
        """The request ends here: free it on this worker and every peer, and tell the caller."""
        self._release(seq)
        out.releases.append(seq.request_id)
        out.events.append(self._event(seq, list(tokens), logprobs, finish_reason=reason, error=error))

    def _event(self, seq: Sequence, tokens: list[int] | None = None, logprobs: list | None = None, **kw) -> WorkerEvent:
        """An event of this model's; the first once the prompt is scored carries its records."""
        fed, seq.num_fed = seq.num_fed, 0
        prompt = None
        if seq.prompt_logprobs is not None and not seq.prompt_logprobs_sent and not seq.needs_prompt_logits:
            prompt, seq.prompt_logprobs_sent = [None, *seq.prompt_logprobs], True
        return WorkerEvent(
            seq.request_id,
            tokens or [],
            self.name,
            num_fed=fed,
            num_cached_prompt=seq.num_cached_prompt,
            logprobs=logprobs,
            prompt_logprobs=prompt,
            **kw,
        )

    def routing_counters(self) -> dict[str, float | dict[int, int]]:
        """Counters the throughput model reads (plain numbers, and steps by tokens computed; a
        snapshot is not atomic, and need not be)."""
        c = self.counters
        return {
            "steps": c.steps,
            "rows_stepped": c.rows_stepped,
            "tokens_processed": c.tokens_processed,
            "rows_sampled": c.rows_sampled,
            "tokens_kept": c.tokens_kept,
            "handoffs_sent": c.handoffs_sent,
            "catchups": c.catchups,
            "catchup_tokens": c.catchup_tokens,
            "time_step": c.time_step,
            "step_tokens": c.step_tokens.copy(),
        }
