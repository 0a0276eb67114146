"""`POST /chat/completions` without HTTP: a request dict in; a `ChatCompletion` dict, or an async
iterator of chunk dicts, out. The transports put HTTP around it.

Any model name the engine serves is accepted, and the engine routes the request under its
policy as it always does: the name picks nothing. A stream is checked whole before it is
returned (the engine's preparation and the first delta), so a bad request is an error response,
never a stream that fails at once. The read timeout: a whole answer must come within it (the
engine aborts the request there, `deadline_s`), and so must each delta of a stream.
"""

from __future__ import annotations

import math
import uuid

import anyio

from .chunks import StreamChunks, ended_badly
from .errors import APIError, ReadTimedOut, api_error
from .logprobs import LogprobFormatter
from .request import ChatRequest, parse_chat_request
from .response import completion, now, samples
from .stream import CompletionStream, next_delta

BACKSTOP_S = 1.0  # past the engine's own deadline, the answer is given up here too


class ChatCompletions:
    """Chat completions answered by `engine` (an `Engine`; it must be running to answer)."""

    def __init__(self, engine):
        self.engine = engine
        self.formatter: LogprobFormatter | None = None  # once the engine has its tokenizer

    def models(self) -> list[str]:
        """The names a request may give as `model`: the engine's models."""
        return list(self.engine.info().models)

    async def create(self, body, *, read_timeout: float | None = None) -> dict | CompletionStream:
        """The answer to a request body; raises `APIError` (the error response) or `ReadTimedOut`."""
        req = parse_chat_request(body)
        if req.model not in self.models():
            raise APIError(
                404,
                f"The model `{req.model}` does not exist; this engine serves {self.models()}",
                param="model",
                code="model_not_found",
            )
        # the client's clock: the whole answer, or a stream's first delta, by then
        deadline = math.inf if read_timeout is None else anyio.current_time() + read_timeout
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            if req.stream:
                return await self.open_stream(req, request_id, deadline, read_timeout)
            return await self.complete(req, request_id, deadline)
        except (APIError, ReadTimedOut):
            raise
        except Exception as e:
            raise api_error(e, req.renamed) from e

    def engine_kwargs(self, req: ChatRequest, request_id: str) -> dict:
        return {
            "request_id": request_id,
            "tools": req.tools,
            "tool_choice": req.tool_choice,
            "parallel_tool_calls": req.parallel_tool_calls,
        }

    def logprobs(self, req: ChatRequest) -> LogprobFormatter | None:
        if not req.logprobs:
            return None
        tokenizer = self.engine.info().tokenizer
        if self.formatter is None or self.formatter.tokenizer is not tokenizer:
            self.formatter = LogprobFormatter(tokenizer)
        return self.formatter

    async def complete(self, req: ChatRequest, request_id: str, deadline: float) -> dict:
        left = time_left(deadline)
        out = None
        with anyio.move_on_after(None if left is None else left + BACKSTOP_S):
            out = await self.engine.chat(
                req.messages, req.params, deadline_s=left, **self.engine_kwargs(req, request_id)
            )
        timed_out = anyio.current_time() >= deadline
        if out is None:
            raise ReadTimedOut("no answer within the read timeout")
        for sample in samples(out):
            error = ended_badly(sample, timed_out)
            if error is not None:
                raise error
            if sample.finish_reason == "abort":
                raise ReadTimedOut("no answer within the read timeout")
        return completion(request_id, now(), req, out, self.logprobs(req))

    async def open_stream(
        self, req: ChatRequest, request_id: str, deadline: float, read_timeout: float | None
    ) -> CompletionStream:
        deltas = self.engine.stream(req.messages, req.params, **self.engine_kwargs(req, request_id))
        chunks = StreamChunks(request_id, now(), req, self.logprobs(req))
        try:
            head = chunks.start() + chunks.delta(await next_delta(deltas, time_left(deadline)))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await deltas.aclose()
            raise
        return CompletionStream(deltas, chunks, head, read_timeout)


def time_left(deadline: float) -> float | None:
    """Seconds until `deadline` (None: no deadline); past it, the read has timed out."""
    if deadline == math.inf:
        return None
    left = deadline - anyio.current_time()
    if left <= 0:
        raise ReadTimedOut("no answer within the read timeout")
    return left
