"""Timed probes kept per machine, and measured again where they cannot be trusted.

A probe's timings decide how a model computes (probe.py), and a timing taken while something
else ran on the machine says more about that than about the kernels: a probe measured during a
busy minute once read "bfloat16 0.77x at 1, 0.31x at 4, 7.07x at 16 rows" and stayed cached for
good. So each probe is kept with the load it ran under (the CPU time other processes took while
it ran, from /proc/stat, as a fraction of one CPU) and is measured again on a later load where
that load was over `LOAD_LIMIT` or its timings are implausible (a call of more rows twice as fast
as one of fewer, or 1.5x dearer per row), up to `MAX_RUNS` runs in all. Every run keeps, per
kernel and size, the best time of all runs so far: a disturbance only ever adds time.

The key of a probe's file holds what makes its answer: the CPU (model, flags, count), torch's
version, the threads and the shapes, so another machine measures its own. `tokenrouter models
--probes` lists them, `--clear-probes` removes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...files import write_text_atomic

log = logging.getLogger(__name__)

LOAD_LIMIT = 0.25  # other processes' CPU use during a probe, in CPUs, above which it is measured again
MAX_RUNS = 3


@dataclass(frozen=True)
class ProbeRecord:
    """One cached probe: what it measured, the best timings of its runs, and how far to trust them."""

    path: Path
    info: dict  # what the timings depend on (the file's key is made of it)
    timings: dict  # kernel -> rows -> milliseconds per call, the best of all runs
    runs: int
    loads: list  # other processes' CPU use during each run, in CPUs (None: not measurable here)
    problem: str | None  # why the timings are not yet trusted, or None
    measured_at: str = ""

    @property
    def trusted(self) -> bool:
        return self.problem is None or self.runs >= MAX_RUNS


def probe_dir(home: str | Path | None = None) -> Path:
    from ... import store

    return store.home_dir(home) / "probes"


def probe_path(prefix: str, info: dict, home: str | Path | None = None) -> Path:
    key = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    return probe_dir(home) / f"{prefix}-{key}.json"


def machine() -> dict:
    """What besides the CPU model makes a probe's answer: how many CPUs this machine has."""
    return {"cpus": os.cpu_count()}


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (/proc/stat), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@contextmanager
def other_load() -> Iterator[dict]:
    """Measure the CPU time other processes take while the block runs: `out["load"]` is in CPUs
    (0.5: half of one CPU on average), None where /proc/stat is not there."""
    out: dict = {"load": None}
    busy0, own0, t0 = _busy_seconds(), time.process_time(), time.monotonic()
    yield out
    busy1, own1, wall = _busy_seconds(), time.process_time(), time.monotonic() - t0
    if busy0 is not None and busy1 is not None and wall > 0:
        out["load"] = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / wall, 3)


def implausible(timings: dict) -> str | None:
    """Why these timings cannot be a quiet machine's, or None: for any kernel, a call of more rows
    measured much faster than one of fewer, or much dearer per row (both are what a disturbance
    during one size's measurement looks like)."""
    for kernel, by_rows in timings.items():
        sizes = sorted(by_rows)
        for a, b in zip(sizes, sizes[1:]):
            ta, tb = by_rows[a], by_rows[b]
            if tb < 0.5 * ta:  # oneDNN's dense kernels run 4 rows up to 1.5x faster than 2: that is real
                return f"{kernel} measured faster at {b} rows than at {a} ({tb:.3g} ms < {ta:.3g} ms)"
            if tb / b > 1.5 * ta / a:
                return f"{kernel} measured {tb / b / (ta / a):.1f}x dearer per row at {b} rows than at {a}"
    return None


def problem_of(timings: dict, load: float | None) -> str | None:
    if load is not None and load > LOAD_LIMIT:
        return f"other processes used {load:.2f} CPUs while it ran"
    return implausible(timings)


def _rows_as_ints(timings: dict) -> dict:
    return {k: {int(r): float(v) for r, v in by_rows.items()} for k, by_rows in timings.items()}


def read(path: Path, info: dict) -> ProbeRecord | None:
    """The probe cached at `path` if it was measured for `info`, else None."""
    try:
        saved = json.loads(path.read_text())
        if saved.get("info") != info:
            return None
        timings = _rows_as_ints(saved["timings"])
        loads = list(saved.get("loads", []))
        runs = int(saved.get("runs", 1))
        problem = problem_of(timings, loads[-1] if loads else None)
        return ProbeRecord(path, info, timings, runs, loads, problem, saved.get("measured_at", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def measured(path: Path, info: dict, measure: Callable[[], dict], refresh: bool = False) -> ProbeRecord:
    """The probe's record: from the cache where it is trusted, else measured now (under
    `other_load`), merged with the runs before it (the best time per kernel and size) and kept."""
    old = None if refresh else read(path, info)
    if old is not None and old.trusted:
        return old
    with other_load() as load:
        timings = _rows_as_ints(measure())
    if old is not None:
        timings = {
            k: {r: min(v, old.timings.get(k, {}).get(r, v)) for r, v in by_rows.items()}
            for k, by_rows in timings.items()
        }
    runs = (old.runs if old is not None else 0) + 1
    loads = [*(old.loads if old is not None else []), load["load"]]
    problem = problem_of(timings, load["load"])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    record = ProbeRecord(path, info, timings, runs, loads, problem, stamp)
    if problem is not None:
        log.warning("probe %s (run %d of at most %d): %s", path.name, runs, MAX_RUNS, problem)
    body = {"info": info, "timings": timings, "runs": runs, "loads": loads, "problem": problem, "measured_at": stamp}
    try:
        write_text_atomic(path, json.dumps(body, indent=1))
    except OSError as e:  # a read-only home: measure again next time
        log.warning("cannot cache the probe at %s: %s", path, e)
    return record


def list_probes(home: str | Path | None = None) -> list[ProbeRecord]:
    """Every probe cached under the store (`tokenrouter models --probes`)."""
    out = []
    for path in sorted(probe_dir(home).glob("*.json")):
        try:
            info = json.loads(path.read_text()).get("info", {})
        except (OSError, ValueError):
            continue
        record = read(path, info)
        if record is not None:
            out.append(record)
    return out


def clear_probes(home: str | Path | None = None) -> int:
    """Remove every cached probe; the next load measures again. Returns how many were removed."""
    paths = list(probe_dir(home).glob("*.json"))
    for path in paths:
        path.unlink(missing_ok=True)
    return len(paths)
