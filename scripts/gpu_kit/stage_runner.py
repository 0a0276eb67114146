"""How the device run runs a stage: under a cap cut to what is left of the budget, its output streamed to the log,
its process group killed past the cap (exit 124, as timeout(1) says); background jobs beside it; and a clock that
is either the wall clock or, for the CPU tests, a fake one on which simulated stages take their expected time
and the run can be killed at a chosen second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .lists import ROOT


class Log:
    """Everything printed, to stdout and to `path`, line by line (a kill loses nothing already said)."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def __call__(self, line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        self.f.write(line + "\n")


@dataclass
class Simulation:
    """GPU_KIT_SIMULATE (tests only, never on the GPU): "STAGE=RC[@SECONDS] ...": no stage command runs; each
    is logged with its environment to `commands`, returns RC (0 where the stage is not named) and takes SECONDS
    on the clock (its expected time where not given); "STAGE=run" runs that one for real."""

    spec: dict[str, str]
    commands: Path

    @classmethod
    def parse(cls, text: str, commands: Path) -> Simulation | None:
        if not text.strip():
            return None
        return cls(dict(kv.split("=", 1) for kv in text.split()), commands)

    def outcome(self, name: str, expected: float) -> tuple[int, float] | None:
        """(rc, seconds) to pretend, or None where the stage runs for real."""
        v = self.spec.get(name, "0")
        if v == "run":
            return None
        rc, _, secs = v.partition("@")
        return int(rc), float(secs) if secs else expected

    def record(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        keys = ("PYTHONPATH", "TOKENROUTER_PREFILL_BACKEND", "TVM_FFI_DISABLE_TORCH_C_DLPACK", "MAX_JOBS")
        with open(self.commands, "a") as f:
            f.write("\t".join([name, *(f"{k}={env.get(k, '')}" for k in keys), " ".join(map(str, cmd))]) + "\n")


class Clock:
    """The wall clock, in seconds since the run began."""

    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def spend(self, seconds: float) -> None:
        """A simulated stage's time: the wall clock lets it pass in an instant."""


class FakeClock(Clock):
    """GPU_KIT_FAKE_CLOCK=1: time moves only as simulated stages spend it; GPU_KIT_KILL_AT=S kills the process
    (SIGKILL, as the device tool's limit does) when the clock would pass S."""

    def __init__(self, kill_at: float | None):
        self.t = 0.0
        self.kill_at = kill_at

    def now(self) -> float:
        return self.t

    def spend(self, seconds: float) -> None:
        if self.kill_at is not None and self.t + seconds >= self.kill_at:
            self.t = self.kill_at
            os.kill(os.getpid(), signal.SIGKILL)
        self.t += seconds


def run_command(cmd: list[str], env: dict[str, str], cap: float, log: Log, output: Path | None = None) -> int:
    """Run `cmd` in a session of its own, its lines to `log` (or to `output` for a background job); past `cap`
    seconds its process group gets SIGTERM, then SIGKILL 10 s later, and the status is 124."""
    out = open(output, "w") if output else None
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    RUNNING.add(proc)

    def pump():
        for line in proc.stdout:
            (out.write(line) if out else log(line.rstrip("\n")))
        if out:
            out.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=cap)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc = 124
    finally:
        RUNNING.discard(proc)
    reader.join(timeout=5)
    if out:
        out.close()
    return rc


RUNNING: set[subprocess.Popen] = set()  # what a SIGTERM to the run must take along


def kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Job:
    """A background job: started beside the stages, recorded as a stage when it ends."""

    name: str
    cap: float
    started: float
    expected: float = 0.0
    thread: threading.Thread | None = None
    rc: int | None = None
    ended: float | None = None
    recorded: bool = False  # its record is written (it ended, or the run needed it and went on)
    waited_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def done(self, now: float) -> bool:
        if self.thread is None:  # simulated: ends at its expected time on the clock
            return now >= self.started + self.expected
        return not self.thread.is_alive()
