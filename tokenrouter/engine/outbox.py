"""What one call into a `ModelCore` sends out: events for the caller, hand-offs for peers, and
the requests whose pending copies the peers must drop. The thread that stepped the core delivers
it, in that order (engine/worker/thread.py).

Plain data, so the caller's side (`api/output_processor.py`, `api/request_channel.py`) depends
on these and not on the worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policies import PeerMessage
from .sequence import Request


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
    logprobs: list | None = None  # one outputs.TokenLogprob per token of token_ids, when the request asks
    prompt_logprobs: list | None = None  # the prompt's records (the first None), once, when asked


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
