"""A worker's inbox: what the caller and the peer workers ask of it, applied between its steps.

Posts come from any thread; only the stepping thread drains. Once closed (the worker stopped or
died) a post is refused, so the poster knows at once that the request will not be served."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ...policies import PeerMessage
from ..sequence import Request


@dataclass(frozen=True)
class Submit:
    """A new request from the caller: the worker admits it as a sequence of its own and
    prefills it (or takes its cached prefix)."""

    req: Request


@dataclass(frozen=True)
class HandOff:
    """A request arriving from a peer, with the tokens the peer wrote that this worker has not seen."""

    msg: PeerMessage
    req: Request


@dataclass(frozen=True)
class Abort:
    """The caller ends a request: its owner reports the end, a pending copy is dropped."""

    request_id: str


@dataclass(frozen=True)
class Release:
    """Drop the pending copy of a request that ended elsewhere: the owner has already told the
    caller, so nothing is reported."""

    request_id: str


@dataclass(frozen=True)
class Stop:
    """Finish: end what is still here, then leave the loop."""


@dataclass(frozen=True)
class Call:
    """Run `fn(core)` in the stepping thread between steps, alone on the cores (profiling,
    forgetting the prefix cache); the future gets its result or its error."""

    fn: Callable[[Any], Any]
    future: Future


Message = Submit | HandOff | Abort | Release | Stop | Call


class Inbox:
    def __init__(self, wake: threading.Event | None = None):
        self.wake = wake if wake is not None else threading.Event()  # set by every post
        self._messages: deque[Message] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def post(self, message: Message) -> bool:
        """Queue a message; False if the inbox is closed (the worker has stopped or died)."""
        with self._lock:
            if self._closed:
                return False
            self._messages.append(message)
        self.wake.set()
        return True

    def take(self) -> Message | None:
        """The oldest message, or None (the stepping thread only)."""
        with self._lock:
            return self._messages.popleft() if self._messages else None

    def snapshot(self) -> list[Message]:
        """The messages waiting now, oldest first (for tests and debugging)."""
        with self._lock:
            return list(self._messages)

    def close(self) -> None:
        """Refuse every later post; messages already queued stay to be drained."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._messages)
