"""Continuous batching with chunked prefill, pending requests, and preemption by recompute.

Every step: running sequences first (decodes take one token of the step's token budget each;
unfinished prefills and catch-ups of requests back from a peer take chunks of what is left),
then waiting sequences are admitted while budget, batch size and KV blocks allow. A waiting
sequence whose next uncached prefix block another admission computes in the same step waits one
step, then reuses it from the prefix cache (SGLang deprioritises in-batch prefix duplicates the
same way): requests that arrive together with a shared system prompt compute it once.

A request away at a peer is *pending*: it keeps its blocks, so on return only the unseen suffix
is computed. When blocks run out, pending requests are evicted first (least recently parked
first; they recompute on return), then the most recently admitted running sequence is
preempted: its blocks are freed and it waits to be recomputed. Nothing generated is ever lost.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..kv import BlockManager
from ..sequence import SeqStatus, Sequence
from .batch import ScheduledBatch


@dataclass(frozen=True)
class SchedulerStats:
    """Where this worker's requests stand, and what memory pressure has cost so far."""

    running: int
    waiting: int
    pending: int  # away at a peer, blocks kept unless evicted
    preemptions: int
    evictions: int


@dataclass
class StepFill:
    """A step's batch as it is being filled: the token budget left, and the rows so far."""

    budget: int
    decodes: list[Sequence] = field(default_factory=list)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    kept: list[Sequence] = field(default_factory=list)  # running, keeping their blocks, skipping this step
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.decodes) + len(self.prefills) + len(self.kept)

    def take(self, seq: Sequence, n: int) -> None:
        self.budget -= n
        if n == 1 and seq.num_uncomputed == 1:
            self.decodes.append(seq)
        else:
            self.prefills.append((seq, n))


class PoolTooSmall(Exception):
    """A sequence needs more KV than the whole pool holds."""


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.pending: OrderedDict[str, Sequence] = OrderedDict()  # insertion order: oldest parked first
        self.num_preemptions = 0
        self.num_evictions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    @property
    def num_ready(self) -> int:
        return len(self.waiting) + len(self.running)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            len(self.running), len(self.waiting), len(self.pending), self.num_preemptions, self.num_evictions
        )

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def park(self, seq: Sequence) -> None:
        """The request left for a peer: keep its blocks, stop scheduling it."""
        self.running.remove(seq)
        seq.status = SeqStatus.PENDING
        self.pending[seq.request_id] = seq

    def resume(self, seq: Sequence) -> None:
        """The request is back: catch up on the unseen suffix, or recompute if it was evicted."""
        del self.pending[seq.request_id]
        if seq.block_table:
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
        else:
            self.add(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished, aborted or failed) and free its blocks."""
        if seq.status is SeqStatus.PENDING:
            self.pending.pop(seq.request_id, None)
        else:
            queue = self.running if seq.status is SeqStatus.RUNNING else self.waiting
            try:
                queue.remove(seq)
            except ValueError:
                pass
        self.blocks.free(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.status = SeqStatus.WAITING
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _evict_pending(self, blocks_needed: int) -> bool:
        """Free pending requests' blocks, oldest first, until `blocks_needed` are free."""
        for seq in self.pending.values():
            if self.blocks.num_free >= blocks_needed:
                break
            if seq.block_table:
                self.blocks.free(seq)
                self.num_evictions += 1
        return self.blocks.num_free >= blocks_needed

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        if self.blocks.grow(seq, num_tokens):
            return True
        need = self.blocks.blocks_for(num_tokens) - len(seq.block_table)
        return self._evict_pending(need) and self.blocks.grow(seq, num_tokens)

    def _too_big(self, num_tokens: int) -> PoolTooSmall:
        return PoolTooSmall(
            f"request needs KV for {num_tokens} tokens but the pool of this worker holds "
            f"{self.blocks.capacity_tokens} tokens ({self.blocks.num_blocks} blocks of {self.blocks.block_size})"
        )

    @staticmethod
    def _chunk(seq: Sequence, budget: int) -> int:
        """Tokens of the sequence to compute this step: all, or a chunk that leaves the positions
        whose logits it needs (a verifier's check) whole for its last chunk (0: none fits now)."""
        n = min(seq.num_uncomputed, budget)
        if n < seq.num_uncomputed:
            n = min(n, seq.num_uncomputed - seq.verify_span)
        return max(n, 0)

    def schedule(self) -> tuple[ScheduledBatch | None, list[tuple[Sequence, Exception]]]:
        """Pick this step's batch; also return sequences that can never fit, to be failed."""
        step = StepFill(self.max_num_batched_tokens)
        self.schedule_running(step)
        self.admit_waiting(step)
        self.running.extend(step.decodes)
        self.running.extend(s for s, _ in step.prefills)
        self.running.extend(step.kept)
        if not step.decodes and not step.prefills:
            return None, step.failed
        seqs = step.decodes + [s for s, _ in step.prefills]
        num_new = [1] * len(step.decodes) + [n for _, n in step.prefills]
        return ScheduledBatch(seqs=seqs, num_new=num_new, num_decode=len(step.decodes)), step.failed

    def schedule_running(self, step: StepFill) -> None:
        """Running decodes first (one token each), then unfinished prefills and catch-ups; when a
        sequence needs a block and none is free, the most recently admitted is preempted."""
        queue = deque(sorted(self.running, key=lambda s: s.num_uncomputed > 1))
        self.running.clear()
        while queue:
            seq = queue.popleft()
            n = seq.num_uncomputed
            if n > 1:
                n = self._chunk(seq, step.budget)
            if n == 0 or step.budget == 0:
                step.kept.append(seq)
                continue
            target = seq.num_computed + n
            while not self._grow(seq, target):
                victim = queue.pop() if queue else None
                if victim is None:
                    if not step.rows:
                        step.failed.append((seq, self._too_big(target)))
                        self.blocks.free(seq)
                    else:
                        self._preempt(seq)
                    seq = None
                    break
                self._preempt(victim)
            if seq is not None:
                step.take(seq, n)

    def admit_waiting(self, step: StepFill) -> None:
        """Admit waiting sequences while budget, batch size and KV blocks allow. One whose next
        uncached block another admission computes in this very step waits a step and then finds
        it cached (the prefix is computed once)."""
        computing: set[int] = set()  # hashes of the full blocks this step's admissions compute
        deferred: list[Sequence] = []
        bs = self.blocks.block_size
        while self.waiting and step.budget > 0 and step.rows < self.max_num_seqs:
            seq = self.waiting[0]
            total = len(seq.token_ids)
            if self.blocks.blocks_for(total) > self.blocks.num_blocks:
                self.waiting.popleft()
                step.failed.append((seq, self._too_big(total)))
                continue
            hashes: list[int] = []
            if not seq.block_table:
                hashes, cached = self.blocks.prefix_hashes(seq)
                if cached < len(hashes) and hashes[cached] in computing:
                    deferred.append(self.waiting.popleft())
                    continue
                self.blocks.match_prefix(seq, (hashes, cached))
            n = self._chunk(seq, step.budget)
            if n == 0:  # its last chunk must hold a verifier's check whole: next step
                self.blocks.free(seq)
                break
            need = self.blocks.blocks_for(seq.num_computed + n) - len(seq.block_table)
            if need > self.blocks.num_free:
                self._evict_pending(need)
            fits = (len(seq.block_table) + self.blocks.num_free) * bs - seq.num_computed
            if fits < n:
                if step.rows:  # others hold the memory: wait for them to finish
                    self.blocks.free(seq)
                    break
                n = self._chunk(seq, fits)  # alone: prefill in chunks that fit
                if n <= 0:
                    self.blocks.free(seq)
                    break
            self.blocks.grow(seq, seq.num_computed + n)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            computing.update(hashes[seq.num_computed // bs : (seq.num_computed + n) // bs])
            step.take(seq, n)
        self.waiting.extendleft(reversed(deferred))  # first in line next step, in their order
