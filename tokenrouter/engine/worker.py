"""A worker: one model, its KV pool, its scheduler and its step loop, in a background thread.

The worker never blocks on anyone: the caller and peer workers post to its inbox, and it posts
its results (new tokens, hand-offs, ends) to a sink callback, once per step for the whole
batch. After each step the policy routes the batch; requests that move are parked here as
pending, with their KV blocks kept, and a message with the suffix the peer has not seen goes to
the peer's inbox.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ..config import ModelSpec
from ..errors import ConfigError
from ..throughput import ThroughputPrediction
from ..policies.base import ENTROPY, HIDDEN, TOKEN_EMBEDDING, PeerMessage, Policy, StepResult, normalized_entropy
from .attention_choice import choose_attention_backend
from .block_manager import BlockManager
from .core_share import CoreShare, usable_cores, use_threads
from .cuda_graph import DecodeGraphs
from .kv_cache import KVCache, KVLayout
from .model_loader import LoadedModel, load_model
from .model_runner import ModelRunner, ScheduledBatch
from .sampler import Sampler, SamplingTensors
from .scheduler import Scheduler
from .sequence import Request, SeqStatus, Sequence
from .torch_attention import TorchPagedAttention

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_TOKENS = 16384
MAX_STALLS = 8  # hand-offs in a row without a new token before a request is failed


@dataclass
class WorkerEvent:
    """What a step did to one request: tokens it appended, a hand-off, or the request's end."""

    request_id: str
    token_ids: list[int]
    model: str
    finish_reason: str | None = None
    error: str | None = None
    handoff_to: str | None = None
    resubmit: PeerMessage | None = None  # standard-serving baseline: the caller sends this on
    num_fed: int = 0  # tokens this worker processed for the request since its previous event
    num_cached_prompt: int = 0


Sink = Callable[[list[WorkerEvent]], None]


@dataclass
class WorkerStats:
    model: str
    kv_blocks_total: int
    kv_blocks_free: int
    kv_block_size: int
    kv_cache_bytes: int
    running: int
    waiting: int
    pending: int
    steps: int
    tokens_processed: int
    preemptions: int
    evictions: int
    handoffs_received: int
    handoffs_sent: int
    prefix_cache_hit_tokens: int
    batch_size_histogram: dict[int, int]
    time_forward_s: float  # inside the model's forward
    time_step_s: float  # whole steps: schedule, forward, sample, route, bookkeeping
    time_idle_s: float  # nothing to do
    time_waiting_for_batch_s: float  # holding back to gather a batch of B (delayed batching)
    alive: bool
    error: str | None
    batch_min: int = 1  # B in force (delayed batching)
    time_waiting_for_cores_s: float = 0.0  # on CPU: waiting for another worker's step (engine/core_share.py)
    attention_backend: str = ""  # "torch" or "flashinfer" (ModelSpec.attention_backend)
    cuda_graph_batch_sizes: list[int] = field(default_factory=list)  # decode steps replayed from CUDA graphs
    torch_threads: int | None = None  # torch threads the forwards are meant to run on
    steps_by_threads: dict[int, int] = field(default_factory=dict)  # steps by the torch threads they ran on
    # delayed_batching="auto": the throughput model's current choice and prediction (the same
    # object for every model; `Engine.stats()` fills it in)
    throughput_prediction: ThroughputPrediction | None = None


class Worker:
    """Everything torch does for a model (loading it, allocating its KV pool, every step) happens
    in the worker's own thread: with GNU OpenMP, another thread that has run a multi-threaded torch
    op stays in libgomp's count, and once threads outnumber cores libgomp stops spinning between
    parallel regions and each op gets ~25% slower."""

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        sink: Sink,
        policy: Policy,
        batch_min: int = 1,
        batch_wait_s: float = 0.0,
        keep_kv_on_handoff: bool = True,
        num_threads: int | None = None,
        core_share: CoreShare | None = None,
    ):
        self.name = name
        self.spec = spec
        self.sink = sink
        self.policy = policy
        self.routing = name in policy.models and len(policy.models) > 1
        self.model_index = policy.models.index(name) if name in policy.models else -1
        self.batch_min = max(1, min(batch_min, spec.max_num_seqs))
        self.batch_wait_s = batch_wait_s
        # False is the "standard serving" baseline: a hand-off frees this worker's KV and goes back
        # to the caller, who sends the whole sequence to the peer as a new request (re-prefill).
        self.keep_kv_on_handoff = keep_kv_on_handoff
        self.num_threads = num_threads  # torch intra-op threads of this worker's thread
        self.core_share = core_share  # else: on CPU, steps taken in turns with the other workers
        self.peers: dict[str, Worker] = {}
        self.loaded: LoadedModel | None = None  # set by setup(), in the worker's thread
        self._ready = threading.Event()
        self._setup_error: BaseException | None = None
        self.seqs: dict[str, Sequence] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._inbox_lock = threading.Lock()
        self._closed = False  # set under _inbox_lock when the loop ends: posts are refused after
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        # stats
        self.steps = 0
        self.tokens_processed = 0
        self.handoffs_received = 0
        self.handoffs_sent = 0
        self.batch_sizes: Counter[int] = Counter()
        self.steps_by_threads: Counter[int] = Counter()
        self.time_forward = 0.0
        self.time_step = 0.0
        self.time_idle = 0.0
        self.time_waiting_for_batch = 0.0
        # what the throughput model observes (engine/auto_batching.py, delayed_batching="auto"); ints, read from any thread
        self.rows_stepped = 0  # sum of batch sizes over steps
        self.rows_sampled = 0  # tokens sampled (rows whose last token was computed)
        self.tokens_kept = 0  # sampled tokens the policy kept
        self.catchups = 0  # requests arrived from a peer
        self.catchup_tokens = 0  # tokens they needed computed on arrival
        self.step_tokens: dict[int, int] = {}  # steps by the tokens they computed (a plain dict: copy() is atomic)
        self.torch_threads: int | None = None  # torch threads its forwards run on (the compute thread's, if shared)
        self.time_waiting_for_cores = 0.0
        self.attention_backend = ""  # "torch" or "flashinfer", chosen at setup
        self.runner: ModelRunner | None = None  # set by setup()

    def setup(self) -> None:
        """Load the model and allocate the KV pool; runs in the thread that will step this worker."""
        try:
            if self.num_threads is not None:
                own = forward_threads = self.num_threads
            elif self.core_share is not None:  # forwards run in the shared compute thread, on every core;
                own, forward_threads = 1, self.core_share.cores  # this thread's ops (loading, sampling) stay off OpenMP teams
            else:  # alone on the cores, whatever count the caller's threads set
                own = forward_threads = usable_cores()
            use_threads(own)
            self.torch_threads = forward_threads
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
            text = loaded.model.config.get_text_config()
            self.attention_backend = choose_attention_backend(spec, loaded.device, loaded.dtype, layout.head_dim)
            graph_batch = 0
            if self.attention_backend == "flashinfer":
                graph_batch = min(spec.cuda_graph_max_batch, spec.max_num_seqs)
            # CUDA graphs pad decode steps with rows that write one extra block, no request's
            self.cache = KVCache(layout, num_blocks + (1 if graph_batch else 0), spec.block_size, loaded.device)
            self.blocks = BlockManager(num_blocks, spec.block_size, spec.enable_prefix_caching)
            self.scheduler = Scheduler(self.blocks, spec.max_num_seqs, spec.max_num_batched_tokens)
            capture = self.routing and HIDDEN in self.policy.requires
            compute = self.core_share.run if self.core_share is not None else None
            if self.attention_backend == "flashinfer":
                from .flashinfer_attention import FlashInferPagedAttention

                backend = FlashInferPagedAttention(self.cache, text.num_attention_heads, loaded.device)
            else:
                backend = TorchPagedAttention(self.cache)
            self.runner = ModelRunner(loaded, backend, spec.block_size, capture, compute, forward_threads)
            if graph_batch:
                self._capture_graphs(backend, graph_batch, num_blocks, loaded.max_model_len)
            self.sampler = Sampler()
            self.loaded = loaded
        except BaseException as e:
            self._setup_error = e
            with self._inbox_lock:
                self._closed = True
        finally:
            self._ready.set()

    def _capture_graphs(self, backend, max_batch: int, scratch_block: int, max_model_len: int) -> None:
        """CUDA graphs of decode steps; a model whose forward cannot be captured (a host sync in
        it, as in dynamic RoPE scaling) runs every step eagerly instead, with a warning."""
        pages = -(-max_model_len // self.spec.block_size)
        graphs = DecodeGraphs(self.runner, backend, max_batch, scratch_block, pages)
        try:
            graphs.capture()
        except Exception as e:
            log.warning("model %r: CUDA graph capture failed, decode steps run eagerly: %s", self.name, e)
            return
        self.runner.graphs = graphs

    @property
    def cuda_graph_sizes(self) -> list[int]:
        """Decode batch sizes replayed from CUDA graphs (none on CPU, or if capture failed)."""
        graphs = self.runner.graphs if self.runner is not None else None
        return list(graphs.sizes) if graphs is not None else []

    def wait_ready(self) -> LoadedModel:
        """Block until setup() is done; re-raise its error (missing weights, bad budget, ...)."""
        self._ready.wait()
        if self._setup_error is not None:
            raise self._setup_error
        assert self.loaded is not None
        return self.loaded

    # ---- called from other threads -------------------------------------------------------
    def connect(self, peers: dict[str, Worker]) -> None:
        self.peers = {name: w for name, w in peers.items() if w is not self}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"tokenrouter-worker-{self.name}", daemon=True)
        self._thread.start()

    def submit(self, req: Request) -> bool:
        return self._post("add", req)

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def release(self, request_id: str) -> None:
        """Drop a pending copy of a request that ended elsewhere."""
        self._post("release", request_id)

    def hand_off(self, msg: PeerMessage, req: Request) -> bool:
        return self._post("handoff", (msg, req))

    def stop(self) -> None:
        self._post("stop", None)

    def set_batch_min(self, b: int) -> None:
        """Change B (delayed batching) at run time, from any thread; the loop re-checks at once."""
        self.batch_min = max(1, min(int(b), self.spec.max_num_seqs))
        self._wake.set()

    def profile(self, **options) -> Future:
        """Measure this model's step latency (engine/latency_profile.py) in the worker's thread,
        between steps; the future gets the LatencyProfile or the error."""
        future: Future = Future()
        if not self._post("profile", (options, future)):
            future.set_exception(RuntimeError(f"worker {self.name!r} is not running: {self.error or 'stopped'}"))
        return future

    def reset_prefix_cache(self) -> Future:
        """Forget the prefix cache's free blocks, in the worker's thread between steps; the future
        gets the number of blocks forgotten."""
        future: Future = Future()
        if not self._post("reset_prefix_cache", future):
            future.set_exception(RuntimeError(f"worker {self.name!r} is not running: {self.error or 'stopped'}"))
        return future

    def routing_counters(self) -> dict[str, float | dict[int, int]]:
        """Counters the throughput model reads (plain numbers, and steps by tokens computed; a
        snapshot is not atomic, and need not be)."""
        return {
            "steps": self.steps,
            "rows_stepped": self.rows_stepped,
            "tokens_processed": self.tokens_processed,
            "rows_sampled": self.rows_sampled,
            "tokens_kept": self.tokens_kept,
            "handoffs_sent": self.handoffs_sent,
            "catchups": self.catchups,
            "catchup_tokens": self.catchup_tokens,
            "time_step": self.time_step,
            "step_tokens": self.step_tokens.copy(),
        }

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def _post(self, kind: str, payload: object) -> bool:
        with self._inbox_lock:
            if self._closed:
                return False
            self._inbox.append((kind, payload))
        self._wake.set()
        return True

    def stats(self) -> WorkerStats:
        return WorkerStats(
            model=self.name,
            kv_blocks_total=self.blocks.num_blocks,
            kv_blocks_free=self.blocks.num_free,
            kv_block_size=self.blocks.block_size,
            kv_cache_bytes=self.cache.nbytes,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            pending=len(self.scheduler.pending),
            steps=self.steps,
            tokens_processed=self.tokens_processed,
            preemptions=self.scheduler.num_preemptions,
            evictions=self.scheduler.num_evictions,
            handoffs_received=self.handoffs_received,
            handoffs_sent=self.handoffs_sent,
            prefix_cache_hit_tokens=self.blocks.prefix_hits,
            batch_size_histogram=dict(sorted(self.batch_sizes.items())),
            time_forward_s=self.time_forward,
            time_step_s=self.time_step,
            time_idle_s=self.time_idle,
            time_waiting_for_batch_s=self.time_waiting_for_batch,
            alive=self.alive,
            error=self.error,
            batch_min=self.batch_min,
            time_waiting_for_cores_s=self.time_waiting_for_cores,
            attention_backend=self.attention_backend,
            cuda_graph_batch_sizes=self.cuda_graph_sizes,
            torch_threads=self.torch_threads,
            steps_by_threads=dict(self.steps_by_threads),
        )

    # ---- the worker thread ---------------------------------------------------------------
    def _run(self) -> None:
        """On CUDA, everything the worker does runs on its own stream, so two workers on one GPU overlap."""
        device = torch.device(self.spec.device)
        if device.type == "cuda" and torch.cuda.is_available():
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                self._serve()
        else:
            self._serve()

    def _serve(self) -> None:
        hold_since: float | None = None
        self.setup()
        if self._setup_error is not None:
            return
        try:
            with torch.inference_mode():
                while True:
                    self._wake.clear()
                    self._drain_inbox()
                    if self._stopping:
                        break
                    ready = self.scheduler.num_ready
                    if ready == 0:
                        hold_since = None
                        t0 = time.perf_counter()
                        self._wake.wait(timeout=1.0)
                        self.time_idle += time.perf_counter() - t0
                        continue
                    if ready < self.batch_min and self.batch_wait_s > 0:  # delayed batching
                        now = time.perf_counter()
                        hold_since = hold_since or now
                        left = self.batch_wait_s - (now - hold_since)
                        if left > 0:
                            self._wake.wait(timeout=left)
                            self.time_waiting_for_batch += time.perf_counter() - now
                            continue
                    hold_since = None
                    if self._take_turn():
                        if self.core_share is not None:
                            self._drain_inbox()  # what arrived while we waited joins this step
                            if self._stopping:
                                continue
                        self._step()
        except BaseException as e:  # the loop itself broke: fail everything, report, and die
            self.fail(e)
        finally:
            self._end_turn()
            self.shut_down()

    def _take_turn(self) -> bool:
        """On a shared CPU, wait for the other workers' steps (engine/core_share.py); False if stopping."""
        if self.core_share is None:
            return True
        t0 = time.perf_counter()
        took = self.core_share.take(self.name, give_up=lambda: self._stopping)
        self.time_waiting_for_cores += time.perf_counter() - t0
        return took

    def _end_turn(self) -> None:
        if self.core_share is not None:
            self.core_share.give(self.name)

    def fail(self, e: BaseException) -> None:
        self.error = f"worker {self.name!r} died: {type(e).__name__}: {e}"
        log.error("%s\n%s", self.error, traceback.format_exc())

    def shut_down(self) -> None:
        """Refuse further posts, then end whatever is still here (called once, by the stepping thread)."""
        with self._inbox_lock:
            self._closed = True
        self._drain_inbox()  # whatever arrived before the door closed
        self._end_all("abort" if self.error is None else "error", self.error)

    def _drain_inbox(self) -> None:
        events: list[WorkerEvent] = []
        while self._inbox:
            kind, payload = self._inbox.popleft()
            if kind == "add":
                req: Request = payload  # type: ignore[assignment]
                self._admit(Sequence(req, token_ids=list(req.prompt_ids)))
            elif kind == "handoff":
                self._receive(*payload, events)  # type: ignore[misc]
            elif kind == "abort":
                seq = self.seqs.get(payload)  # type: ignore[arg-type]
                if seq is not None:
                    owner = seq.status is not SeqStatus.PENDING
                    self._release(seq)
                    if owner:
                        events.append(self._event(seq, finish_reason="abort"))
            elif kind == "release":
                seq = self.seqs.get(payload)  # type: ignore[arg-type]
                if seq is not None:
                    self._release(seq)
            elif kind == "stop":
                self._stopping = True
            elif kind == "profile":
                self._profile(*payload)  # type: ignore[misc]
            elif kind == "reset_prefix_cache":
                if payload.set_running_or_notify_cancel():  # type: ignore[union-attr]
                    payload.set_result(self.blocks.forget_free_prefixes())  # type: ignore[union-attr]
        if events:
            self.sink(events)

    def _profile(self, options: dict, future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        if self._stopping or self._closed:
            future.set_exception(RuntimeError(f"worker {self.name!r} is stopping"))
            return
        try:
            from .latency_profile import measure

            held = self.core_share is not None and self.core_share.holder == self.name
            if not held and not self._take_turn():  # time steps alone on the cores, as they run when serving
                raise RuntimeError(f"worker {self.name!r} is stopping")
            try:
                future.set_result(measure(self, **options))
            finally:
                if not held:
                    self._end_turn()
        except Exception as e:
            log.exception("worker %r: profiling failed", self.name)
            future.set_exception(e)

    def _admit(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def _receive(self, msg: PeerMessage, req: Request, events: list[WorkerEvent]) -> None:
        """A request arrives from a peer: take the suffix, then catch up (or prefill if new here)."""
        self.handoffs_received += 1
        seq = self.seqs.get(msg.request_id)
        if req.aborted or self._stopping or self._closed:  # aborted in transit: end it here
            if seq is not None:
                self._release(seq)
            events.append(WorkerEvent(req.request_id, [], self.name, finish_reason="abort"))
            self._release_peers(req.request_id)
            return
        held = len(seq.token_ids) if seq is not None else 0
        if not msg.start <= held <= msg.start + len(msg.tokens):  # a gap, or the sender knows less than us
            error = f"hand-off from {msg.source!r} carries tokens [{msg.start}, {msg.start + len(msg.tokens)}) but {self.name!r} holds {held}"
            if seq is not None:
                self._release(seq)
            events.append(WorkerEvent(req.request_id, [], self.name, finish_reason="error", error=error))
            self._release_peers(req.request_id)
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
        self.catchups += 1
        self.catchup_tokens += seq.num_uncomputed

    def _end_all(self, reason: str, error: str | None) -> None:
        """End every request this worker owns, and drop its pending copies (the owner ends those)."""
        events = []
        for seq in list(self.seqs.values()):
            owner = seq.status is not SeqStatus.PENDING
            self.scheduler.remove(seq)
            if owner:
                self._release_peers(seq.request_id)  # free its pending copies on the other workers
                events.append(self._event(seq, finish_reason=reason, error=error))
        self.seqs.clear()
        if events:
            self.sink(events)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)

    def _release_peers(self, request_id: str) -> None:
        for peer in self.peers.values():
            peer.release(request_id)

    def _end(self, seq: Sequence, events: list[WorkerEvent], reason: str, error: str | None = None, tokens=()) -> None:
        """The request ends here: free it on this worker and every peer, and tell the caller."""
        self._release(seq)
        self._release_peers(seq.request_id)
        events.append(self._event(seq, list(tokens), finish_reason=reason, error=error))

    def _event(self, seq: Sequence, tokens: list[int] | None = None, **kw) -> WorkerEvent:
        fed, seq.num_fed = seq.num_fed, 0
        return WorkerEvent(
            seq.request_id, tokens or [], self.name, num_fed=fed, num_cached_prompt=seq.num_cached_prompt, **kw
        )

    def _step(self) -> None:
        t_start = time.perf_counter()
        events: list[WorkerEvent] = []
        outgoing: list[tuple[Worker, PeerMessage, Request]] = []
        batch, failed = self.scheduler.schedule()
        for seq, exc in failed:
            self._end(seq, events, "error", str(exc))
        if batch is not None:
            try:
                self._run_batch(batch, events, outgoing)
            except Exception as e:  # a failed forward fails its batch, not the worker
                log.exception("worker %r: step failed", self.name)
                msg = f"model {self.name!r} step failed: {type(e).__name__}: {e}"
                for seq in batch.seqs:
                    if self.seqs.get(seq.request_id) is seq and seq.status is not SeqStatus.PENDING:
                        self._end(seq, events, "error", msg)
        self.time_step += time.perf_counter() - t_start
        # Events before messages: a peer's tokens must never reach the caller before ours.
        if events:
            self.sink(events)
        late: list[WorkerEvent] = []
        for peer, msg, req in outgoing:
            if not peer.hand_off(msg, req):  # the peer has stopped or died
                seq = self.seqs.get(req.request_id)
                reason, err = ("abort", None) if self._stopping or peer.error is None else ("error", peer.error)
                if seq is not None:
                    self._end(seq, late, reason, err)
                else:
                    late.append(WorkerEvent(req.request_id, [], self.name, finish_reason=reason, error=err))
        if late:
            self.sink(late)
        self._end_turn()  # after the hand-offs are posted, so a peer waiting for the turn steps them

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        if all(s.req.params.temperature == 0.0 for s in seqs):  # all greedy: no sampling tensors needed
            return logits.argmax(dim=-1)
        st = SamplingTensors.build(
            [s.req.params for s in seqs], [s.req.seed for s in seqs], [s.num_generated for s in seqs], logits.device
        )
        return self.sampler(logits, st)

    def _run_batch(self, batch: ScheduledBatch, events: list[WorkerEvent], outgoing: list) -> None:
        out = self.runner.forward(batch)
        self.time_forward += out.model_time
        self.steps += 1
        self.batch_sizes[len(batch)] += 1
        self.steps_by_threads[out.threads] += 1
        self.rows_stepped += len(batch)
        for seq, n in zip(batch.seqs, batch.num_new):
            seq.num_computed += n
            seq.num_fed += n
            self.blocks.register_full_blocks(seq)
        n_tokens = sum(batch.num_new)
        self.tokens_processed += n_tokens
        self.step_tokens[n_tokens] = self.step_tokens.get(n_tokens, 0) + 1
        seqs = [batch.seqs[r] for r in out.sample_rows]
        if not seqs:
            return
        sampled = self._sample(seqs, out.logits)
        tokens = sampled.tolist()
        if self.routing:
            try:
                keep, next_model = self._route(seqs, out.logits, sampled, out.hidden)
            except Exception as e:  # a policy that raises fails the requests of this call only
                log.exception("worker %r: policy.route failed", self.name)
                msg = f"policy {type(self.policy).__name__}.route failed: {type(e).__name__}: {e}"
                for seq in seqs:
                    self._end(seq, events, "error", msg)
                return
        else:
            keep, next_model = None, None
        self.rows_sampled += len(seqs)
        self.tokens_kept += len(seqs) if keep is None else sum(map(bool, keep))
        for i, seq in enumerate(seqs):
            kept = keep is None or keep[i]
            target = self.model_index if next_model is None else next_model[i]
            self._apply(seq, tokens[i], kept, target, events, outgoing)

    def _apply(self, seq: Sequence, token: int, kept: bool, target: int, events: list, outgoing: list) -> None:
        """One request's outcome of a step: append the token (if kept), finish, stay, or hand off."""
        new = [token] if kept else []
        if kept:
            seq.token_ids.append(token)
            seq.stalls = 0
            req = seq.req
            if (token in self.loaded.eos_token_ids and not req.params.ignore_eos) or token in req.stop_token_ids:
                return self._end(seq, events, "stop", tokens=new)
            if seq.num_generated >= req.max_tokens:
                return self._end(seq, events, "length", tokens=new)
        if target == self.model_index:
            if not kept:
                return self._end(seq, events, "error", "policy discarded a token without handing the request off")
            events.append(self._event(seq, new))
            return
        # Hand off: park here with blocks kept, send the peer the suffix it has not seen.
        if not kept:
            seq.stalls += 1
            if seq.stalls > MAX_STALLS:
                return self._end(
                    seq, events, "error", f"policy handed the request off {seq.stalls} times without a token"
                )
        name = self.policy.models[target]
        ev = self._event(seq, new, handoff_to=name)
        events.append(ev)
        known = seq.peer_known.get(name, 0) if self.keep_kv_on_handoff else 0
        msg = PeerMessage(seq.request_id, self.name, name, seq.token_ids[known:], start=known, stalls=seq.stalls)
        try:
            msg = self.policy.send(msg, seq.policy_state)
        except Exception as e:
            return self._end(seq, events, "error", f"policy {type(self.policy).__name__}.send failed: {e}")
        self.handoffs_sent += 1
        if not self.keep_kv_on_handoff:  # standard-serving baseline: free KV, the caller re-sends
            self._release(seq)
            ev.resubmit = msg
            return
        seq.peer_known[name] = len(seq.token_ids)
        self.scheduler.park(seq)
        outgoing.append((self.peers[name], msg, seq.req))

    def _route(self, seqs: list[Sequence], logits: torch.Tensor, sampled: torch.Tensor, hidden) -> tuple[list, list]:
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
