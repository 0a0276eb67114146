"""A worker: one model, its KV pool, its scheduler and its step loop, in a background thread.

The worker never blocks on anyone: callers post commands to its inbox and it posts its results
(new tokens, finished requests) to a sink callback, once per step for the whole batch.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from .block_manager import BlockManager
from .kv_cache import KVCache, KVLayout
from .model_loader import LoadedModel
from .model_runner import ModelRunner, ScheduledBatch
from .sampler import Sampler, SamplingTensors
from .scheduler import Scheduler
from .sequence import Request, Sequence
from .torch_attention import TorchPagedAttention

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_TOKENS = 16384


@dataclass
class WorkerEvent:
    """What a step did to one request: tokens it appended, and whether the request ended here."""

    request_id: str
    token_ids: list[int]
    model: str
    finish_reason: str | None = None
    error: str | None = None
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
    steps: int
    preemptions: int
    prefix_cache_hit_tokens: int
    batch_size_histogram: dict[int, int]
    time_forward_s: float
    time_step_s: float
    time_idle_s: float
    alive: bool
    error: str | None


class Worker:
    def __init__(self, loaded: LoadedModel, sink: Sink):
        spec = loaded.spec
        self.name = loaded.name
        self.loaded = loaded
        self.sink = sink
        layout = KVLayout.from_config(loaded.model.config, loaded.dtype)
        tokens = spec.kv_cache_tokens
        if tokens is None and spec.kv_cache_bytes is None:
            tokens = DEFAULT_KV_CACHE_TOKENS
        num_blocks = KVCache.num_blocks_for(layout, spec.block_size, tokens, spec.kv_cache_bytes)
        if num_blocks < 1:
            raise ValueError(
                f"model {self.name!r}: the KV budget is smaller than one block of {spec.block_size} tokens "
                f"({spec.block_size * layout.bytes_per_token} bytes)"
            )
        self.cache = KVCache(layout, num_blocks, spec.block_size, loaded.device)
        self.blocks = BlockManager(num_blocks, spec.block_size)
        self.scheduler = Scheduler(self.blocks, spec.max_num_seqs, spec.max_num_batched_tokens)
        self.runner = ModelRunner(loaded, TorchPagedAttention(self.cache), spec.block_size)
        self.sampler = Sampler()
        self.seqs: dict[str, Sequence] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        # stats
        self.steps = 0
        self.batch_sizes: Counter[int] = Counter()
        self.time_forward = 0.0
        self.time_step = 0.0
        self.time_idle = 0.0

    # ---- called from other threads -------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"tokenrouter-worker-{self.name}", daemon=True)
        self._thread.start()

    def submit(self, req: Request) -> None:
        self._post("add", req)

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def stop(self) -> None:
        self._post("stop", None)

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _post(self, kind: str, payload: object) -> None:
        self._inbox.append((kind, payload))
        self._wake.set()

    def stats(self) -> WorkerStats:
        return WorkerStats(
            model=self.name,
            kv_blocks_total=self.blocks.num_blocks,
            kv_blocks_free=self.blocks.num_free,
            kv_block_size=self.blocks.block_size,
            kv_cache_bytes=self.cache.nbytes,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            steps=self.steps,
            preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_tokens=self.blocks.prefix_hits,
            batch_size_histogram=dict(sorted(self.batch_sizes.items())),
            time_forward_s=self.time_forward,
            time_step_s=self.time_step,
            time_idle_s=self.time_idle,
            alive=self.alive,
            error=self.error,
        )

    # ---- the worker thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                self._drain_inbox()
                if self._stopping:
                    break
                if not self.scheduler.has_work():
                    t0 = time.perf_counter()
                    self._wake.wait(timeout=1.0)
                    self.time_idle += time.perf_counter() - t0
                    continue
                self._step()
        except BaseException as e:  # the loop itself broke: fail everything, report, and die
            self.error = f"worker {self.name!r} died: {type(e).__name__}: {e}"
            log.error("%s\n%s", self.error, traceback.format_exc())
        finally:
            self._end_all("abort" if self.error is None else "error", self.error)

    def _drain_inbox(self) -> None:
        events: list[WorkerEvent] = []
        while self._inbox:
            kind, payload = self._inbox.popleft()
            if kind == "add":
                req: Request = payload  # type: ignore[assignment]
                seq = Sequence(req)
                self.seqs[req.request_id] = seq
                self.scheduler.add(seq)
            elif kind == "abort":
                seq = self.seqs.pop(payload, None)  # type: ignore[arg-type]
                if seq is not None:
                    self.scheduler.remove(seq)
                    events.append(WorkerEvent(seq.request_id, [], self.name, finish_reason="abort"))
            elif kind == "stop":
                self._stopping = True
        if events:
            self.sink(events)

    def _end_all(self, reason: str, error: str | None) -> None:
        events = []
        for seq in list(self.seqs.values()):
            self.scheduler.remove(seq)
            events.append(WorkerEvent(seq.request_id, [], self.name, finish_reason=reason, error=error))
        self.seqs.clear()
        if events:
            self.sink(events)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)

    def _step(self) -> None:
        t_start = time.perf_counter()
        events: list[WorkerEvent] = []
        batch, failed = self.scheduler.schedule()
        for seq, exc in failed:
            self._release(seq)
            events.append(WorkerEvent(seq.request_id, [], self.name, finish_reason="error", error=str(exc)))
        if batch is not None:
            try:
                self._run_batch(batch, events)
            except Exception as e:  # a failed forward fails its batch, not the worker
                log.exception("worker %r: step failed", self.name)
                msg = f"model {self.name!r} step failed: {type(e).__name__}: {e}"
                for seq in batch.seqs:
                    if seq.request_id in self.seqs:
                        self._release(seq)
                        events.append(WorkerEvent(seq.request_id, [], self.name, finish_reason="error", error=msg))
        if events:
            self.sink(events)
        self.time_step += time.perf_counter() - t_start

    def _run_batch(self, batch: ScheduledBatch, events: list[WorkerEvent]) -> None:
        out = self.runner.forward(batch)
        self.time_forward += out.model_time
        self.steps += 1
        self.batch_sizes[len(batch)] += 1
        for seq, n in zip(batch.seqs, batch.num_new):
            seq.num_computed += n
            self.blocks.register_full_blocks(seq)
        reqs = [batch.seqs[r].req for r in out.sample_rows]
        if not reqs:
            tokens = []
        elif all(r.params.temperature == 0.0 for r in reqs):  # all greedy: no sampling tensors needed
            tokens = out.logits.argmax(dim=-1).tolist()
        else:
            st = SamplingTensors.build(
                [r.params for r in reqs], [r.seed for r in reqs], [r.num_generated for r in reqs], out.logits.device
            )
            tokens = self.sampler(out.logits, st).tolist()
        eos = self.loaded.eos_token_ids
        for row, token in zip(out.sample_rows, tokens):
            seq = batch.seqs[row]
            req = seq.req
            first = req.num_generated == 0
            req.token_ids.append(token)
            req.token_models.append(self.name)
            reason = None
            if (token in eos and not req.params.ignore_eos) or token in req.stop_token_ids:
                reason = "stop"
            elif req.num_generated >= req.max_tokens:
                reason = "length"
            ev = WorkerEvent(req.request_id, [token], self.name, finish_reason=reason)
            if first:
                ev.num_cached_prompt = seq.num_cached_prompt
            events.append(ev)
            if reason is not None:
                self._release(seq)
