"""The requests a core holds, and the ways one leaves: dropped, ended, or parked for its return.

This is the bookkeeping the core shares with its routing (engine/handoff.py) and verification
(engine/verify.py): they take a `HeldRequests`, not the core, so a request's trip never calls
back up into `ModelCore`.
"""

from __future__ import annotations

from .outbox import Outbox, WorkerEvent
from .sched import Scheduler
from .sequence import SeqStatus, Sequence


class HeldRequests:
    """Each request this core holds (running, waiting or pending), as its `Sequence`, by id: the
    core's own dict, kept in step with its scheduler."""

    def __init__(self, model: str, seqs: dict[str, Sequence], scheduler: Scheduler):
        self.model = model  # whom the events name
        self.seqs = seqs
        self.scheduler = scheduler

    def admit(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def drop(self, seq: Sequence) -> None:
        """Forget a request here and free its blocks."""
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)

    def park(self, seq: Sequence) -> None:
        """Keep a request that moved to a peer pending here, its blocks kept for its return."""
        self.scheduler.park(seq)

    def end(self, seq: Sequence, out: Outbox, reason: str, error: str | None = None, tokens=(), logprobs=None) -> None:
        """The request ends here: free it on this worker and every peer, and tell the caller."""
        self.drop(seq)
        out.releases.append(seq.request_id)
        out.events.append(self.event(seq, list(tokens), logprobs, finish_reason=reason, error=error))

    def end_all(self, out: Outbox, reason: str, error: str | None = None) -> None:
        """End every request this core owns, everywhere, and drop its pending copies (a pending
        request's owner is the peer it is at, which ends it there)."""
        for seq in list(self.seqs.values()):
            if seq.status is SeqStatus.PENDING:
                self.drop(seq)
            else:
                self.end(seq, out, reason, error)

    def event(self, seq: Sequence, tokens: list[int] | None = None, logprobs: list | None = None, **kw) -> WorkerEvent:
        """An event of this model's; the first once the prompt is scored carries its records."""
        fed, seq.num_fed = seq.num_fed, 0
        prompt = None
        if seq.prompt_logprobs is not None and not seq.prompt_logprobs_sent and not seq.needs_prompt_logits:
            prompt, seq.prompt_logprobs_sent = [None, *seq.prompt_logprobs], True
        return WorkerEvent(
            seq.request_id,
            tokens or [],
            self.model,
            num_fed=fed,
            num_cached_prompt=seq.num_cached_prompt,
            logprobs=logprobs,
            prompt_logprobs=prompt,
            **kw,
        )
