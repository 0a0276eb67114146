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

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.req.num_prompt_tokens
