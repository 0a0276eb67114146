"""`travel-size`: the bytes a device `run` sends (the working tree as git sees it, plus the carried paths)
against the device tool's limit."""

from __future__ import annotations

import subprocess

from .console import say
from .lists import ROOT

TRAVEL_LIMIT = 64 << 20  # bytes a device `run` may send (working tree + carried paths)
KIT_LIMIT = 60 << 20  # what the kit allows itself: 4 MiB of room for the tree to grow between checks
COMMAND_LIMIT = 2000  # characters of a device `run` command


def travel_bytes(carry: list[str]) -> tuple[int, int, int]:
    """(working tree, carried paths, total) in bytes: tracked files and untracked files git does not ignore,
    as the device tool sends them, plus the carried paths."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    tree = 0
    for rel in {p for p in out.decode().split("\0") if p}:
        p = ROOT / rel
        if p.is_file() and not p.is_symlink():
            tree += p.stat().st_size
    carried = 0
    for c in carry:
        p = ROOT / c
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()] if p.exists() else []
        carried += sum(f.stat().st_size for f in files)
    return tree, carried, tree + carried


def cmd_travel_size(args) -> int:
    tree, carried, total = travel_bytes(args.carry)
    ok = total <= KIT_LIMIT
    say(
        f"what travels: working tree {tree / 2**20:.2f} MiB + carried {' '.join(args.carry)} {carried / 2**20:.2f} MiB "
        f"= {total / 2**20:.2f} MiB (the kit's limit {KIT_LIMIT >> 20} MiB, the device tool's {TRAVEL_LIMIT >> 20})"
        + ("" if ok else "  FAIL: over the kit's limit")
    )
    return 0 if ok else 1
