"""What an httpx-style transport does here, whichever library it serves: read the request, ask
`OpenAIServer`, and hand back a response whose body streams. httpx's ASGITransport gathers a
whole body before it answers (no streaming, no closing early); these do neither.

A library's transports (`httpx_transports.py`, `httpx2_transports.py`) mix these classes into its
base classes and name the library in `http`, whose `Response` and `ReadTimeout` they build.
The client's read timeout (`request.extensions["timeout"]["read"]`) is the server's to keep:
past it the request is aborted and `http.ReadTimeout` raised, as a socket's read would time out.
The sync classes run the engine's side in the `LLM`'s event loop (`LLM.run`, `LLM.iterate`).
"""

from __future__ import annotations

from ..errors import EngineNotRunningError
from .errors import ReadTimedOut
from .server import EventStream, OpenAIServer, Reply, error_reply


def read_timeout(request) -> float | None:
    return (request.extensions.get("timeout") or {}).get("read")


class AsyncEvents:
    """A stream's body for an async client, read in the caller's task; closing it aborts the request."""

    http = None  # the library: httpx or httpx2

    def __init__(self, events: EventStream, request):
        self.events = events
        self.request = request

    async def __aiter__(self):
        try:
            async for data in self.events:
                yield data
        except ReadTimedOut as e:
            raise self.http.ReadTimeout(str(e), request=self.request) from None

    async def aclose(self) -> None:
        await self.events.aclose()


class AsyncExchange:
    """`handle_async_request` of an async transport answered by `engine` (an `Engine`)."""

    http = None
    events_class: type[AsyncEvents]

    def __init__(self, engine):
        self.server = OpenAIServer(engine)

    async def handle_async_request(self, request):
        body = await request.aread()
        try:
            reply = await self.server.handle(request.method, request.url.path, body, read_timeout(request))
        except ReadTimedOut as e:
            raise self.http.ReadTimeout(str(e), request=request) from None
        if reply.events is None:
            return self.http.Response(reply.status, headers=reply.headers, content=reply.body, request=request)
        stream = self.events_class(reply.events, request)
        return self.http.Response(reply.status, headers=reply.headers, stream=stream, request=request)


class SyncEvents:
    """A stream's body for a sync client: the events come from the LLM's loop, one at a time."""

    http = None

    def __init__(self, llm, events: EventStream, request):
        self.llm = llm
        self.events = events
        self.request = request
        self.reading = None  # LLM.iterate's iterator, once reading began

    def __iter__(self):
        self.reading = self.llm.iterate(lambda: self.events)
        try:
            yield from self.reading
        except ReadTimedOut as e:
            raise self.http.ReadTimeout(str(e), request=self.request) from None

    def close(self) -> None:
        if self.reading is not None:
            self.reading.close()  # leaving LLM.iterate cancels its task: the request is aborted
        else:  # never read: the stream has begun all the same
            self.llm.run(self.events.aclose)


class SyncExchange:
    """`handle_request` of a sync transport answered by `llm` (an `LLM`) in its event loop."""

    http = None
    events_class: type[SyncEvents]

    def __init__(self, llm):
        self.llm = llm
        self.server = OpenAIServer(llm.engine)

    def handle_request(self, request):
        body = request.read()
        try:
            reply = self.llm.run(self.server.handle, request.method, request.url.path, body, read_timeout(request))
        except ReadTimedOut as e:
            raise self.http.ReadTimeout(str(e), request=request) from None
        except EngineNotRunningError as e:  # the LLM is closed
            reply = error_reply(e)
        return self.response(reply, request)

    def response(self, reply: Reply, request):
        if reply.events is None:
            return self.http.Response(reply.status, headers=reply.headers, content=reply.body, request=request)
        stream = self.events_class(self.llm, reply.events, request)
        return self.http.Response(reply.status, headers=reply.headers, stream=stream, request=request)
