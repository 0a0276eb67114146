"""The policy interface: route, send and receive, written for one request, run for a batch.

After every step of a worker, `route(result)` sees the whole batch's step result as tensors and
says, per request, whether to keep the sampled token and which model writes next. When a request
moves, `send` builds the message to the peer (the engine fills in the token suffix the peer has
not seen) and `receive` turns it into the peer's local state. Built-in policies decide with
tensor ops, never a Python loop over requests.

A *verifying* policy (VERIFY in `requires`) also gets, when a request returns to its verifier
(the last of its models) with tokens another model wrote, the verifier's distributions at every
one of those positions, from the catch-up step that computes them anyway. `verify(result)` says
how many to accept; the engine rolls back the rest everywhere, and the verifier writes the next
position. Until accepted, tokens the other models write are tentative: the caller never sees
them, so a stream never takes text back.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from .fields import VERIFY


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum(p log p) / log V of softmax(logits), per row; in [0, 1]. Computed in float32 or
    wider, whatever the logits' dtype: in bf16 a routing decision near a threshold would differ
    from the CPU's."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    # a token masked out (-inf, structured output) adds nothing, as 0 log 0 = 0
    h = -torch.where(torch.isneginf(logp), 0.0, logp.exp() * logp).sum(dim=-1)
    return h / math.log(logits.shape[-1])


@dataclass
class StepResult:
    """One worker step, for the requests that sampled a token in it (row i = request_ids[i])."""

    model: str  # the model that stepped
    model_index: int  # its index in policy.models
    request_ids: list[str]
    tokens: torch.Tensor  # [B] sampled token ids
    logits: torch.Tensor  # [B, V] next-token logits, in the model's compute dtype, after the request's penalties
    num_generated: torch.Tensor  # [B] tokens already generated before this one
    states: list[dict]  # the policy's per-request fields, mutable
    entropy: torch.Tensor | None = None  # [B] normalized entropy, if the policy requires ENTROPY
    hidden: torch.Tensor | None = None  # [B, H] last hidden states, if the policy requires HIDDEN
    token_embedding: torch.Tensor | None = None  # [B, H] sampled tokens' embeddings, if TOKEN_EMBEDDING
    params: list = field(default_factory=list)  # each request's SamplingParams
    seeds: list[int] = field(default_factory=list)  # each request's seed (for reproducible draws)
    # a verifying policy's drafter: the tentative tokens each request holds, this one included
    tentative: torch.Tensor | None = None
    # if HISTORY: each request's tokens before this step's (prompt and generated), the worker's own
    # lists, lent for this call: read them, never change or keep them
    history: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass
class VerifyResult:
    """The verifier's catch-up over tentative tokens, for the requests that arrived with some.

    Request i brought `num_drafts[i]` tokens written by `sources[i]`, `drafts[i, :num_drafts[i]]`,
    starting at sequence position `start[i]`. `logits[i, j]` is the verifier's next-token logits
    before draft j (j = 0 .. num_drafts[i]), penalized (when the request asks) with the tokens
    before it; row num_drafts[i] is the distribution of the position after the last draft. Rows
    past it are padding."""

    model: str
    model_index: int
    request_ids: list[str]
    sources: list[str]
    start: torch.Tensor  # [B] long
    num_drafts: torch.Tensor  # [B] long, >= 1
    drafts: torch.Tensor  # [B, K] long, -1 past num_drafts
    logits: torch.Tensor  # [B, K + 1, V]
    num_generated: torch.Tensor  # [B] tokens generated before the first draft
    states: list[dict]
    params: list = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass
class Verdict:
    """Per request: how many of its drafts to accept (a prefix), and optionally the token the
    verifier writes after them (-1, or `tokens` None: the engine samples it from the verifier's
    own distribution there, with the request's sampling parameters)."""

    accept: torch.Tensor  # [B] long, 0 .. num_drafts
    tokens: torch.Tensor | None = None  # [B] long


@dataclass
class Route:
    """Per row: keep the sampled token? and the index (in policy.models) of the model that writes next.

    Discarding a token requires handing the request to another model, which regenerates that
    position; keeping it and staying is ordinary decoding.

    A verifying policy may, on its verifier's own step, propose tokens to follow a kept token
    that stays (`proposals[i]`, at most `max_draft`; [] for none): they become tentative at once,
    with no model's step to write them, and the verifier's next step checks them as it checks a
    drafter's (`verify` sees them with `sources[i]` the verifier itself). Prompt lookup drafts so.
    """

    keep: torch.Tensor  # [B] bool
    next_model: torch.Tensor  # [B] long
    proposals: list[list[int]] | None = None  # per row: token ids to check next (verifier only)

    @classmethod
    def stay(cls, result: StepResult) -> Route:
        n = len(result)
        return cls(torch.ones(n, dtype=torch.bool), torch.full((n,), result.model_index, dtype=torch.long))


@dataclass
class PeerMessage:
    """What one worker sends another when a request moves."""

    request_id: str
    source: str
    target: str
    tokens: list[int]  # the suffix of the request's tokens the target has not seen (as far as the source knows)
    start: int = 0  # position of tokens[0] in the request's whole sequence (prompt included)
    confirmed: int = 0  # tokens before this position are confirmed; later ones are tentative (verifying policies)
    fields: dict = field(default_factory=dict)  # the policy's own fields
    stalls: int = 0  # hand-offs in a row that added no token (the engine's guard against ping-pong)
    # requests asking logprobs (verifying policies): the drafters' records of the tentative tokens
    # in `tokens`, by sequence position; a rolled-back token's goes with it
    logprobs: dict = field(default_factory=dict)


class Policy(ABC):
    """A routing algorithm. Subclasses name their models and implement `route`.

    `requires` lists the optional step-result fields the policy reads (ENTROPY, HIDDEN,
    TOKEN_EMBEDDING); the engine computes only those.
    """

    requires: frozenset[str] = frozenset()
    max_draft: int | None = None  # a verifying policy: most tentative tokens before the verifier checks them

    @property
    def verifier(self) -> str | None:
        """A verifying policy's verifier: its last model. Tokens the other models write are
        tentative until it accepts them. None for a policy that does not verify."""
        return self.models[-1] if VERIFY in self.requires else None

    def verify(self, result: VerifyResult) -> Verdict:
        """A verifying policy's acceptance of the tentative tokens (batched, like `route`)."""
        raise NotImplementedError(f"{type(self).__name__} requires VERIFY but does not implement verify()")

    @property
    def wants_profiles(self) -> bool:
        """Whether the engine should measure its models' step latencies at start (autobatch's
        latency profiles, cached) and hand them to `use_profiles`."""
        return False

    def use_profiles(self, profiles: dict) -> None:
        """Each model's LatencyProfile (its `.table(tokens)` gives seconds per step), at start."""

    def use_in_flight(self, count) -> None:
        """At start: `count()` gives the requests in flight in the engine now (submitted, not yet
        ended, wherever they are), for a policy that plans by load. Called from worker threads."""

    def validate(self, models: dict) -> None:
        """Called at engine start with each model's `LoadedModel`: raise ConfigError if the policy
        cannot serve these models (e.g. a learned router trained for another pair)."""

    @property
    @abstractmethod
    def models(self) -> list[str]:
        """Names of the models this policy routes between, as keys of `Engine(models=...)`."""

    @property
    def entry_model(self) -> str:
        """The model every request starts on (default: the first)."""
        return self.models[0]

    def start_model(self) -> str:
        """The model a new request starts on, asked once as the engine submits it (default:
        `entry_model`). A policy that plans by load may start a request elsewhere. Every model
        uses `entry_model`'s tokenizer either way: the engine checks they encode alike."""
        return self.entry_model

    def route(self, result: StepResult) -> Route:
        """Decide, for a batch, keep/discard and who writes next. Default: stay."""
        return Route.stay(result)

    def send(self, msg: PeerMessage, state: dict) -> PeerMessage:
        """Build the message to the peer. Default: carry the policy's per-request fields along."""
        msg.fields.update(state)
        return msg

    def receive(self, msg: PeerMessage, state: dict) -> None:
        """Take a message into the receiver's per-request state. The tokens are always accepted."""
        state.update(msg.fields)
