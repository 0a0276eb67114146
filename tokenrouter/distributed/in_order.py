"""Envelopes applied in the order each sender sent them.

Ray runs a threaded actor's calls in no promised order, and one sender's envelopes to a worker
carry things that must not be reordered (a request's submission and its abort; a hand-off and
the release that follows its end). Each sender numbers its envelopes 1, 2, ...; the receiver
holds an early one until the gap before it is filled."""

from __future__ import annotations

import threading

from .wire import Envelope


class InOrder:
    def __init__(self):
        self._next: dict[str, int] = {}
        self._held: dict[str, dict[int, Envelope]] = {}
        self._lock = threading.Lock()

    def accept(self, env: Envelope) -> list[Envelope]:
        """The envelopes ready now, in order: `env` and any it unblocked (none if a gap remains).
        An envelope seen before is dropped."""
        with self._lock:
            want = self._next.get(env.sender, 1)
            if env.seq < want:
                return []
            held = self._held.setdefault(env.sender, {})
            held[env.seq] = env
            ready = []
            while want in held:
                ready.append(held.pop(want))
                want += 1
            self._next[env.sender] = want
            return ready

    def waiting(self) -> int:
        """Envelopes held back for a gap (for tests and debugging)."""
        with self._lock:
            return sum(len(h) for h in self._held.values())
