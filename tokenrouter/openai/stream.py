"""A stream that has begun: the chunks of a request whose first delta has come, to its end.

`aclose()` ends the request (aborted, its KV freed) whether or not the chunks were read, and
whichever task reads them: a transport hands the stream to its caller, who may drop it unread.
"""

from __future__ import annotations

import anyio

from .chunks import StreamChunks
from .errors import ReadTimedOut


class CompletionStream:
    """Async iterator of chunk dicts: `head` (the chunks ready when it began), then one delta's
    chunks at a time, each delta within the read timeout."""

    def __init__(self, deltas, chunks: StreamChunks, head: list[dict], read_timeout: float | None):
        self.deltas = deltas  # the engine's stream, begun
        self.chunks = chunks
        self.head = head
        self.read_timeout = read_timeout
        self.iterator = self.run()

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> dict:
        return await self.iterator.__anext__()

    async def aclose(self) -> None:
        await self.iterator.aclose()
        with anyio.CancelScope(shield=True):
            await self.deltas.aclose()

    async def run(self):
        try:
            for chunk in self.head:
                yield chunk
            while True:
                try:
                    delta = await next_delta(self.deltas, self.read_timeout)
                except StopAsyncIteration:
                    break
                for chunk in self.chunks.delta(delta):
                    yield chunk
            for chunk in self.chunks.end():
                yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await self.deltas.aclose()


async def next_delta(deltas, read_timeout: float | None):
    """The engine stream's next delta, waited for as a read of a server's stream would be."""
    try:
        with anyio.fail_after(read_timeout):
            return await deltas.__anext__()
    except TimeoutError:
        raise ReadTimedOut(f"no chunk within the read timeout ({read_timeout} s)") from None
