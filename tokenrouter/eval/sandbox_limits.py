"""The sandbox's terms: what one program may use (`Limits`), what became of it (`Outcome`), and
the one error that is about the sandbox rather than the program. Apart from the machinery
(sandbox.py, sandbox_uid.py, sandbox_bootstrap.py) so that each part of it, and the runner that
only sets limits and reads outcomes, shares them without importing the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..errors import TokenRouterError

Status = Literal["passed", "failed", "timeout", "syntax_error"]


class SandboxError(TokenRouterError):
    """The sandbox itself cannot run programs here (not a verdict on a program)."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. `cpu_s` None: the timeout rounded up, plus one second."""

    timeout_s: float = 10.0
    memory_bytes: int = 2 << 30  # address space; Python itself takes ~20 MiB of it
    cpu_s: int | None = None
    file_bytes: int = 16 << 20  # any file it writes, stdout and stderr included
    processes: int = 8  # RLIMIT_NPROC: its own processes when it has a uid of its own
    open_files: int = 64
    output_bytes: int = 8192  # the tail of stdout/stderr kept in the outcome
    audit_hook: bool = True  # tests switch it off to check the layers under it
    drop_privileges: bool = True  # as root: run as a uid of its own (tests may check without)

    def __post_init__(self):
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"timeout_s: must be a positive number of seconds, got {self.timeout_s!r}")
        for name in ("memory_bytes", "file_bytes", "processes", "open_files", "output_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")

    @property
    def cpu_limit(self) -> int:
        return self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1


@dataclass
class Outcome:
    """What became of one program. `error` is one line: the exception, or why it was stopped."""

    status: Status
    error: str
    returncode: int | None
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    uid: int | None = None  # the uid it ran as (None: this process's own)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


__all__ = ["Limits", "Outcome", "SandboxError", "Status"]
