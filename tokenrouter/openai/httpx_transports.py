"""httpx's transports answered in process (`transport.py` says how): for `httpx.AsyncClient`
(`AsyncHttpxTransport(engine)`) and `httpx.Client` (`HttpxTransport(llm)`)."""

from __future__ import annotations

import httpx

from .transport import AsyncEvents, AsyncExchange, SyncEvents, SyncExchange


class AsyncHttpxEvents(AsyncEvents, httpx.AsyncByteStream):
    http = httpx


class AsyncHttpxTransport(AsyncExchange, httpx.AsyncBaseTransport):
    http = httpx
    events_class = AsyncHttpxEvents


class HttpxEvents(SyncEvents, httpx.SyncByteStream):
    http = httpx


class HttpxTransport(SyncExchange, httpx.BaseTransport):
    http = httpx
    events_class = HttpxEvents
