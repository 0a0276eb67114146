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
class RequestOutput:
    """The result of one request.

    `token_ids` are the generated tokens only; `token_models[i]` names the model that wrote
    `token_ids[i]`. `tokens_processed` counts, per model, the tokens its forward passes took in
    for this request (prompt, catch-ups and recomputation). Times are in seconds from submission.
    """

    request_id: str
    text: str
    token_ids: list[int]
    token_models: list[str]
    finish_reason: FinishReason
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)
    error: str | None = None
    num_cached_prompt_tokens: int = 0
    num_handoffs: int = 0  # times the request moved to another model
    tokens_processed: dict[str, int] = field(default_factory=dict)  # tokens each model's forwards took in
    time_to_first_token: float | None = None
    latency: float = 0.0
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
    carries the whole `output`, with the routing record."""

    request_id: str
    text: str
    token_ids: list[int]
    model: str | None
    finish_reason: FinishReason | None = None
    error: str | None = None
    output: RequestOutput | None = None
    index: int = 0  # which sample of an n > 1 request
