"""The processes a test session started, from /proc: to check that Ray leaves none behind."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _status(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def descendants(root: int | None = None) -> dict[int, str]:
    """Every live descendant of `root` (default: this process): pid -> its command line."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _status(int(entry.name))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry.name))
    out, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            except OSError:
                continue
            todo.append(pid)
    return out


def alive(pid: int) -> bool:
    st = _status(pid)
    return st is not None and st[1] != "Z"  # a zombie has exited; only its entry waits to be reaped


def wait_gone(pids: dict[int, str], timeout: float) -> dict[int, str]:
    """Wait until none of `pids` is alive (at most `timeout`); those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = {pid: cmd for pid, cmd in pids.items() if alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
