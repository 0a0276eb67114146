"""httpx2's transports answered in process (`transport.py` says how): for `httpx2.AsyncClient`
(`AsyncHttpx2Transport(engine)`) and `httpx2.Client` (`Httpx2Transport(llm)`)."""

from __future__ import annotations

import httpx2

from .transport import AsyncEvents, AsyncExchange, SyncEvents, SyncExchange


class AsyncHttpx2Events(AsyncEvents, httpx2.AsyncByteStream):
    http = httpx2


class AsyncHttpx2Transport(AsyncExchange, httpx2.AsyncBaseTransport):
    http = httpx2
    events_class = AsyncHttpx2Events


class Httpx2Events(SyncEvents, httpx2.SyncByteStream):
    http = httpx2


class Httpx2Transport(SyncExchange, httpx2.BaseTransport):
    http = httpx2
    events_class = Httpx2Events
