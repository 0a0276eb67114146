"""Carries a request's worker events from worker threads to the event loop that awaits them.

Workers append to a deque (thread-safe) and wake the waiting task without blocking: on asyncio
through `call_soon_threadsafe`, on trio through its token. Each request is bound to the loop
that submitted it, so several event loops can use one engine at once.
"""

from __future__ import annotations

from collections import deque

import anyio

from ..engine import WorkerEvent


class RequestChannel:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self._events: deque[WorkerEvent] = deque()
        self._event = anyio.Event()
        self._call_soon = _loop_call_soon()

    def push(self, event: WorkerEvent) -> None:
        """Called from a worker thread."""
        self._events.append(event)
        try:
            self._call_soon(self._set)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _set(self) -> None:
        self._event.set()

    async def get(self) -> list[WorkerEvent]:
        """All events so far, waiting for at least one."""
        while not self._events:
            await self._event.wait()
            self._event = anyio.Event()
        out = list(self._events)
        for _ in out:
            self._events.popleft()
        return out


def _loop_call_soon():
    """The running event loop's non-blocking 'call this soon, from any thread'."""
    import asyncio

    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    import trio  # anyio's only other backend

    return trio.lowlevel.current_trio_token().run_sync_soon
