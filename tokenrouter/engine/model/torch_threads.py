"""torch's intra-op thread count, as each thread that computes for the engine must set it, and
the cores this process may run on."""

from __future__ import annotations

import os

import torch


def use_threads(n: int) -> None:
    """Run the calling thread's torch ops on `n` threads, whatever other threads have set.

    torch keeps one process-wide count that each thread copies lazily, at its first parallel op,
    and `set_num_threads` writes both that count and the caller's own: a thread that never sets
    its own runs on whatever count the process had when it first computed (one, in a caller that
    pinned itself to one thread). So every thread that computes for the engine sets its own, and
    re-checks before each forward (a policy may call `set_num_threads` in a worker's thread)."""
    torch.get_num_threads()  # settle the lazy copy first, or it could overwrite ours later
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
