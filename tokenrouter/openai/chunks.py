"""A stream's deltas as OpenAI's `chat.completion.chunk`s, in OpenAI's order.

Per choice: a first chunk with `delta.role`, then content, then tool calls (each whole, in the
chunk where its block closed, `index` counting the choice's calls), then a chunk with
`finish_reason`; with `include_usage`, a last chunk with `usage` and no choices. The last chunk
carries the routing record (`"tokenrouter"`), once every choice has ended.
"""

from __future__ import annotations

from ..outputs import RequestOutput, StreamDelta
from .errors import server_error
from .logprobs import LogprobFormatter
from .request import ChatRequest
from .response import finish_reason, routing_record, tool_call, usage


def ended_badly(out: RequestOutput | StreamDelta, timed_out: bool = False):
    """The error for a request that failed or was aborted (None if it ended well); an abort at
    the client's read timeout is the caller's to raise."""
    if out.finish_reason == "error":
        return server_error(500, f"the request failed: {out.error}", "request_failed")
    if out.finish_reason == "abort" and not timed_out:
        why = f": {out.error}" if out.error else " (the engine closed, or engine.abort was called)"
        return server_error(503, f"the request was aborted{why}", "request_aborted")
    return None


class StreamChunks:
    """The chunks of one streamed request."""

    def __init__(self, request_id: str, created: int, req: ChatRequest, logprobs: LogprobFormatter | None):
        self.request_id = request_id
        self.created = created
        self.req = req
        self.logprobs = logprobs
        self.n = req.params.n
        self.calls = [0] * self.n  # calls streamed so far, per choice
        self.ended: dict[int, RequestOutput] = {}

    def chunk(self, choices: list[dict]) -> dict:
        out = {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.req.include_usage:
            out["usage"] = None  # OpenAI's clients find it null on every chunk but the last
        return out

    def choice(self, index: int, delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
        lp = None if logprobs is None else {"content": logprobs, "refusal": None}
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    def start(self) -> list[dict]:
        return [self.chunk([self.choice(i, {"role": "assistant", "content": ""})]) for i in range(self.n)]

    def delta(self, d: StreamDelta) -> list[dict]:
        """The chunks for one delta; raises the error response if its choice failed."""
        i, out = d.index, []
        lps = self.logprobs.content(d.logprobs) if self.logprobs is not None and d.logprobs else None
        if d.text or lps:
            out.append(self.chunk([self.choice(i, {"content": d.text}, logprobs=lps)]))
        if d.tool_calls:
            calls = []
            for call in d.tool_calls:
                calls.append(tool_call(call, self.calls[i]))
                self.calls[i] += 1
            out.append(self.chunk([self.choice(i, {"tool_calls": calls})]))
        if d.finish_reason is not None:
            error = ended_badly(d)
            if error is not None:
                raise error
            self.ended[i] = d.output
            last = self.chunk([self.choice(i, {}, finish_reason(d.output))])
            if len(self.ended) == self.n and not self.req.include_usage:
                last["tokenrouter"] = routing_record(self.outputs())
            out.append(last)
        return out

    def end(self) -> list[dict]:
        """With include_usage, the usage chunk (and the routing record)."""
        if not self.req.include_usage:
            return []
        last = self.chunk([])
        last["usage"] = usage(self.outputs())
        last["tokenrouter"] = routing_record(self.outputs())
        return [last]

    def outputs(self) -> list[RequestOutput]:
        return [self.ended[i] for i in sorted(self.ended)]
