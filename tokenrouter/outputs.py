"""What a caller gets back: the final output of a request and the deltas of a stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class ToolCall:
    """A call the model made to one of the tools it was given; `arguments` parsed from its JSON."""

    id: str
    name: str
    arguments: dict

    def to_dict(self) -> dict:
        """OpenAI's shape, as chat templates read it in an assistant message's `tool_calls`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class TokenLogprob:
    """One token's log-probability under the model that wrote (or, for a prompt token, scored)
    it, and that model's most likely alternatives there (docs/sampling.md says of which
    distribution).

    `top` holds up to N (token id, logprob) pairs, most likely first, N being the request's
    `logprobs` (or `prompt_logprobs`); tokens the distribution excludes (-inf) are left out, so
    it may hold fewer. The token itself is in it only if it is among them.
    """

    token_id: int
    logprob: float
    model: str
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestOutput:
    """The result of one request.

    `token_ids` are the generated tokens only; `token_models[i]` names the model that wrote
    `token_ids[i]`. `tokens_processed` counts, per model, the tokens its forward passes took in
    for this request (prompt, catch-ups and recomputation). Times are in seconds from submission.

    With `SamplingParams(logprobs=N)`, `logprobs[i]` is `token_ids[i]`'s `TokenLogprob` under its
    writer; with `prompt_logprobs=N`, `prompt_logprobs[j]` is prompt token j's under the entry
    model (`prompt_logprobs[0]` is None: nothing precedes it). Both are None when not asked.
    """

    request_id: str
    text: str
    token_ids: list[int]
    token_models: list[str]
    finish_reason: FinishReason
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)
    error: str | None = None
    num_cached_prompt_tokens: int = 0  # prompt tokens the entry model found in its prefix cache
    num_handoffs: int = 0  # times the request moved to another model
    tokens_processed: dict[str, int] = field(default_factory=dict)  # tokens each model's forwards took in
    time_to_first_token: float | None = None
    latency: float = 0.0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # with tools: the calls parsed from `text`, and `content`, the text without them
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    # n > 1: every sample, each a whole output; the fields above are the first sample's
    completions: list[RequestOutput] = field(default_factory=list, repr=False)

    def message(self) -> dict:
        """The answer as an assistant chat message, to append to the conversation for the next turn."""
        msg: dict = {"role": "assistant", "content": self.text if self.content is None else self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return msg

    def tokens_per_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.token_models:
            counts[m] = counts.get(m, 0) + 1
        return counts


@dataclass
class StreamDelta:
    """New output of a stream. The last delta has `finish_reason` set (its text may be empty) and
    carries the whole `output`, with the routing record. `logprobs` (when asked) holds one entry
    per token of `token_ids`. With tools, `tool_calls` holds the calls whose block closed in this
    delta, whole; a call's raw text never appears in `text`."""

    request_id: str
    text: str
    token_ids: list[int]
    model: str | None
    finish_reason: FinishReason | None = None
    error: str | None = None
    output: RequestOutput | None = None
    index: int = 0  # which sample of an n > 1 request
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
