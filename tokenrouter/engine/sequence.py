"""Per-request state.

`Request` is what all workers share about a request: its tokens and how to sample it. `Sequence`
is one worker's view of it: which KV blocks hold which of its tokens. Keeping them apart lets a
request move between workers while each keeps its own cache of the request.
"""

from __future__ import annotations

import enum
import time
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
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    token_models: list[str] = field(default_factory=list)  # who wrote each generated token
    arrival_time: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    def __len__(self) -> int:
        return len(self.token_ids)


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # needs blocks and (re)prefill
    RUNNING = "running"  # holds blocks; prefilling in chunks or decoding


@dataclass
class Sequence:
    """A worker's state for one request: its block table and how many tokens are in its cache."""

    req: Request
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of req.token_ids whose KV this worker holds
    num_cached_prompt: int = 0  # prompt tokens found in the prefix cache at admission
    num_hashed_blocks: int = 0  # leading full blocks already registered in the prefix cache
    num_preemptions: int = 0

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_uncomputed(self) -> int:
        return len(self.req.token_ids) - self.num_computed
