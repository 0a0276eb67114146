"""Per-request state.

`Request` is what never changes about a request: its prompt and how to sample it. `Sequence` is
one worker's view of it: the tokens this worker knows, which of them its KV blocks hold, and
where it stands. Workers do not share token lists: a hand-off carries the suffix the peer has
not seen, so a worker could live in another process.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..config import SamplingParams


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stop_token_ids: frozenset[int]
    max_tokens: int  # effective: params.max_tokens capped by the context limit
    grammar: object | None = None  # structured output: the compiled grammar (xgrammar), shared and immutable
    # Set by the caller's side when the request is aborted; a worker that receives a hand-off of
    # an aborted request ends it instead of running it (the abort may have passed it in transit).
    aborted: bool = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # needs admission: blocks and (re)prefill
    RUNNING = "running"  # holds blocks; prefilling in chunks, catching up, or decoding
    PENDING = "pending"  # away at a peer; keeps its blocks unless evicted under memory pressure


@dataclass
class Sequence:
    """A worker's state for one request."""

    req: Request
    token_ids: list[int]  # prompt + generated tokens this worker knows
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens of token_ids whose KV this worker holds
    num_cached_prompt: int = 0  # prompt tokens found in the prefix cache at first admission
    num_hashed_blocks: int = 0  # leading full blocks already registered in the prefix cache
    num_fed: int = 0  # tokens put through this worker's forward for the request, not yet reported
    peer_known: dict[str, int] = field(default_factory=dict)  # tokens each peer already knows
    policy_state: dict = field(default_factory=dict)  # the policy's own per-request fields
    stalls: int = 0  # hand-offs in a row that added no token (guards against ping-pong)
    # a verifier's pending check: tokens from `verify_start` on were written by `verify_source` and
    # are tentative; the next forward that reaches the sequence's end returns the verifier's
    # logits from position verify_start - 1 on (verifying policies, policies/base.py)
    verify_start: int | None = None
    verify_source: str | None = None
    num_confirmed: int = 0  # leading tokens the caller may see; later ones are tentative (set at admission)
    grammar: object | None = None  # this worker's matcher of req.grammar (structured/matcher.py), made on first use
    # requests asking logprobs under a verifying policy: each tentative token's record
    # (outputs.TokenLogprob) by position, written by its drafter; it goes where the token goes
    draft_logprobs: dict[int, object] = field(default_factory=dict)
    # prompt_logprobs on the entry model: the records of prompt tokens 1, 2, ... scored so far
    # (None: not asked here); sent with the request's first event once all are in
    prompt_logprobs: list | None = None
    prompt_logprobs_sent: bool = False

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.req.num_prompt_tokens

    @property
    def first_logit_position(self) -> int:
        """The first position whose logits the forward that reaches the end must return: the last
        one, or for a verifier's check the one before the first tentative token."""
        return len(self.token_ids) - 1 if self.verify_start is None else self.verify_start - 1

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt positions whose logits are still to be scored (prompt_logprobs)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.req.num_prompt_tokens - 1

    @property
    def cacheable_length(self) -> int:
        """Leading positions the prefix cache may provide: those before the first position whose
        logits are needed, which are always computed. A prompt still to be scored is computed
        whole (as in vLLM, prompt_logprobs take no cache hits)."""
        if self.needs_prompt_logits:
            return min(self.first_logit_position, len(self.prompt_logprobs))
        return self.first_logit_position

    @property
    def verify_span(self) -> int:
        """Positions whose logits that forward returns: 1, or the check's drafts + 1. They are
        computed in one step (the scheduler's last chunk of the sequence holds them all)."""
        return len(self.token_ids) - self.first_logit_position
