"""The HTTP side of the API without a socket or a library: a method, a path and a body in; a
status, headers and a body (bytes, or server-sent events) out. The transports adapt it to
httpx and httpx2.

Routes, under the base URL's `/v1`: `POST /chat/completions` (`ChatCompletions`), `GET /models`
and `GET /models/{name}` (the engine's models, in OpenAI's list shape). A stream's body is
`data: {chunk}\\n\\n` per chunk, then `data: [DONE]\\n\\n`; an error after the stream began is
one `data: {"error": ...}` event before `[DONE]`, as vLLM sends it (the openai SDK raises it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from .chat_completions import ChatCompletions
from .errors import APIError, ReadTimedOut, api_error
from .response import now
from .stream import CompletionStream

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}


@dataclass
class Reply:
    """A response: `body`, or, for a stream, `events` (SSE bytes; `aclose` ends the request)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    events: EventStream | None = None


class EventStream:
    """A streamed reply's body: each chunk framed as an event. Closing it, read or not, aborts
    the request; a read timeout passing is raised as `ReadTimedOut`."""

    def __init__(self, chunks: CompletionStream):
        self.chunks = chunks
        self.frames = self.frame()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.frames

    async def aclose(self) -> None:
        await self.frames.aclose()
        await self.chunks.aclose()

    async def frame(self):
        try:
            async for chunk in self.chunks:
                yield event(chunk)
        except ReadTimedOut:
            raise
        except Exception as e:  # the request failed after its stream began
            yield event(api_error(e).body())
        finally:
            with anyio.CancelScope(shield=True):
                await self.chunks.aclose()
        yield b"data: [DONE]\n\n"


def event(data: dict) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"


def dumps(data: dict) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


class OpenAIServer:
    """OpenAI's API for `engine`, in process."""

    def __init__(self, engine):
        self.engine = engine
        self.chat = ChatCompletions(engine)

    async def handle(self, method: str, path: str, body: bytes, read_timeout: float | None = None) -> Reply:
        """The reply to one request; raises `ReadTimedOut` where the client would have timed out."""
        try:
            return await self.route(method.upper(), path.rstrip("/"), body, read_timeout)
        except ReadTimedOut:
            raise
        except Exception as e:
            return error_reply(e)

    async def route(self, method: str, path: str, body: bytes, read_timeout: float | None) -> Reply:
        if path.startswith("/v1/"):
            path = path[3:]
        if path == "/chat/completions":
            allow(method, "POST", path)
            answer = await self.chat.create(parse_json(body), read_timeout=read_timeout)
            if isinstance(answer, CompletionStream):
                return Reply(200, {**SSE, "x-request-id": answer.chunks.request_id}, events=EventStream(answer))
            return Reply(200, {**JSON, "x-request-id": answer["id"]}, dumps(answer))
        if path == "/models":
            allow(method, "GET", path)
            return Reply(200, dict(JSON), dumps({"object": "list", "data": [model(m) for m in self.chat.models()]}))
        if path.startswith("/models/"):
            allow(method, "GET", path)
            name = path[len("/models/") :]
            if name not in self.chat.models():
                raise APIError(404, f"The model `{name}` does not exist", param="model", code="model_not_found")
            return Reply(200, dict(JSON), dumps(model(name)))
        raise APIError(404, f"Invalid URL ({method} {path}): this engine serves /chat/completions and /models")


def error_reply(e: Exception) -> Reply:
    error = api_error(e)
    return Reply(error.status, {**JSON, **error.headers}, dumps(error.body()))


def allow(method: str, expected: str, path: str) -> None:
    if method != expected:
        raise APIError(405, f"{method} {path} is not allowed; use {expected}", code="method_not_allowed")


def parse_json(body: bytes):
    try:
        return json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not JSON: {e}") from None


def model(name: str) -> dict:
    return {"id": name, "object": "model", "created": now(), "owned_by": "tokenrouter"}
