"""One model's serving state and its step: scheduler, KV pool, runner, sampler and the policy.

`ModelCore` has no thread and no lock. The thread that steps it (its `WorkerThread`, or the
lockstep driver) calls every method; each method that changes a request's course writes what
must go out into an `Outbox`: events for the caller, hand-offs for peers, and the requests whose
pending copies the peers must drop. The thread delivers it.

After each step the policy routes the batch; a request that moves is parked here as pending,
with its KV blocks kept, and its hand-off carries the suffix the peer has not seen.
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
from ..policies.base import ENTROPY, HIDDEN, TOKEN_EMBEDDING, PeerMessage, Policy, StepResult, normalized_entropy
from .attention_choice import choose_attention_backend
from .batch import ScheduledBatch
from .block_manager import BlockManager
from .events import WorkerEvent
from .kv_cache import KVCache, KVLayout
from .model_loader import LoadedModel, load_model
from .model_runner import ForwardOutput, ModelRunner
from .sampler import Sampler, SamplingTensors
from .scheduler import Scheduler
from .sequence import Request, SeqStatus, Sequence
from .torch_attention import TorchPagedAttention

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
            from .flashinfer_attention import FlashInferPagedAttention

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
        """A new request from the caller."""
        self._admit(Sequence(req, token_ids=list(req.prompt_ids)))

    def receive(self, msg: PeerMessage, req: Request, out: Outbox, refuse: bool = False) -> None:
        """A request arrives from a peer: take the suffix, then catch up (or prefill if new here).
        `refuse`: the worker is stopping, so the request ends here instead."""
        self.counters.handoffs_received += 1
        seq = self.seqs.get(msg.request_id)
        if req.aborted or refuse:  # aborted in transit: end it here
            if seq is not None:
                self._release(seq)
            out.events.append(WorkerEvent(req.request_id, [], self.name, finish_reason="abort"))
            out.releases.append(req.request_id)
            return
        held = len(seq.token_ids) if seq is not None else 0
        if not msg.start <= held <= msg.start + len(msg.tokens):  # a gap, or the sender knows less than us
            error = f"hand-off from {msg.source!r} carries tokens [{msg.start}, {msg.start + len(msg.tokens)}) but {self.name!r} holds {held}"
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
        seq.peer_known[msg.source] = len(seq.token_ids)
        seq.stalls = msg.stalls
        self.counters.catchups += 1
        self.counters.catchup_tokens += seq.num_uncomputed

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
                seqs = [batch.seqs[r] for r in forward.sample_rows]
                if seqs:
                    sampled = self._sample(seqs, forward.logits)
                    decision = self._route(seqs, forward, sampled, out)
                    if decision is not None:
                        self._apply(seqs, sampled.tolist(), *decision, out)
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

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        if all(s.req.params.temperature == 0.0 for s in seqs):  # all greedy: no sampling tensors needed
            return logits.argmax(dim=-1)
        st = SamplingTensors.build(
            [s.req.params for s in seqs], [s.req.seed for s in seqs], [s.num_generated for s in seqs], logits.device
        )
        return self.sampler(logits, st)

    def _route(
        self, seqs: list[Sequence], fwd: ForwardOutput, sampled: torch.Tensor, out: Outbox
    ) -> tuple[list | None, list | None] | None:
        """The policy's decision per row (keep the token? which model next?); (None, None) when
        not routing; None when the policy raised, which fails the requests of this call only."""
        if self.routing:
            try:
                keep, next_model = self._policy_route(seqs, fwd, sampled)
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

    def _policy_route(self, seqs: list[Sequence], fwd: ForwardOutput, sampled: torch.Tensor) -> tuple[list, list]:
        requires = self.policy.requires
        result = StepResult(
            model=self.name,
            model_index=self.model_index,
            request_ids=[s.request_id for s in seqs],
            tokens=sampled,
            logits=fwd.logits,
            num_generated=torch.tensor([s.num_generated for s in seqs]),
            states=[s.policy_state for s in seqs],
            entropy=normalized_entropy(fwd.logits) if ENTROPY in requires else None,
            hidden=fwd.hidden,
            token_embedding=self.loaded.model.get_input_embeddings()(sampled) if TOKEN_EMBEDDING in requires else None,
        )
        decision = self.policy.route(result)
        n = len(seqs)
        if decision.keep.shape != (n,) or decision.next_model.shape != (n,):
            raise ValueError(
                f"route returned shapes {tuple(decision.keep.shape)}, {tuple(decision.next_model.shape)}; expected ({n},)"
            )
        next_model = decision.next_model.tolist()
        if any(not 0 <= m < len(self.policy.models) for m in next_model):
            raise ValueError(f"route returned a model index outside [0, {len(self.policy.models)})")
        return decision.keep.tolist(), next_model

    def _apply(self, seqs: list[Sequence], tokens: list[int], keep: list | None, next_model: list | None, out: Outbox):
        for i, seq in enumerate(seqs):
            kept = keep is None or keep[i]
            target = self.model_index if next_model is None else next_model[i]
            self._apply_one(seq, tokens[i], kept, target, out)

    def _apply_one(self, seq: Sequence, token: int, kept: bool, target: int, out: Outbox) -> None:
        """One request's outcome of a step: append the token (if kept), finish, stay, or hand off."""
        new = [token] if kept else []
        if kept:
            seq.token_ids.append(token)
            seq.stalls = 0
            req = seq.req
            if (token in self.loaded.eos_token_ids and not req.params.ignore_eos) or token in req.stop_token_ids:
                return self._end(seq, out, "stop", tokens=new)
            if seq.num_generated >= req.max_tokens:
                return self._end(seq, out, "length", tokens=new)
        if target == self.model_index:
            if not kept:
                return self._end(seq, out, "error", "policy discarded a token without handing the request off")
            out.events.append(self._event(seq, new))
            return
        # Hand off: park here with blocks kept, send the peer the suffix it has not seen.
        if not kept:
            seq.stalls += 1
            if seq.stalls > MAX_STALLS:
                return self._end(seq, out, "error", f"policy handed the request off {seq.stalls} times without a token")
        name = self.policy.models[target]
        ev = self._event(seq, new, handoff_to=name)
        out.events.append(ev)
        known = seq.peer_known.get(name, 0) if self.keep_kv_on_handoff else 0
        msg = PeerMessage(seq.request_id, self.name, name, seq.token_ids[known:], start=known, stalls=seq.stalls)
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

    # ---- bookkeeping -----------------------------------------------------------------------
    def _admit(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)

    def _end(self, seq: Sequence, out: Outbox, reason: str, error: str | None = None, tokens=()) -> None:
        """The request ends here: free it on this worker and every peer, and tell the caller."""
        self._release(seq)
        out.releases.append(seq.request_id)
        out.events.append(self._event(seq, list(tokens), finish_reason=reason, error=error))

    def _event(self, seq: Sequence, tokens: list[int] | None = None, **kw) -> WorkerEvent:
        fed, seq.num_fed = seq.num_fed, 0
        return WorkerEvent(
            seq.request_id, tokens or [], self.name, num_fed=fed, num_cached_prompt=seq.num_cached_prompt, **kw
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
