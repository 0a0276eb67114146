"""What the kit prints: flushed at once, so its lines and the shell's interleave in order in the log."""

from __future__ import annotations


def say(*a) -> None:
    print(*a, flush=True)
