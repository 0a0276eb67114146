"""A uid of its own for each program, when the sandbox runs as root (layer 4 of sandbox.py): one
no account and no other run uses, an interpreter that uid can run, and, when the program ends,
every process of that uid killed and whatever it left in the shared scratch directories removed.
Apart from the run itself because this is what holds when the audit hook does not, and it talks to
the system (/proc, lock files, uids), not to the program.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import store
from .sandbox_limits import SandboxError

UID_BASE = 64200  # the sandbox's own uids when run as root: UID_BASE .. UID_BASE + UID_SLOTS - 1
UID_SLOTS = 64
PYTHON_ENV = "TOKENROUTER_SANDBOX_PYTHON"  # an interpreter to use instead of looking for one
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def minimal_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed process (the program, and the probes run as its uid)."""
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


_python_cache: dict[bool, str] = {}
_python_lock = threading.Lock()
_next_slot = 0


def _candidates() -> list[str]:
    env = os.environ.get(PYTHON_ENV)
    if env:
        return [env]
    found = [sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    which = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if which:
        found.append(which)
    return [p for p in dict.fromkeys(found) if p and os.path.isfile(p)]


def _probe(python: str, uid: int | None) -> str | None:
    """None when `python` runs as `uid`, else why not."""
    ids = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-B", "-c", "import sys, resource, json; assert sys.version_info >= (3, 8)"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            cwd="/",
            env=minimal_env("/"),
            check=False,
            **ids,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    if done.returncode != 0:
        return (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return None


def interpreter(uid: int | None) -> str:
    """A Python (3.8+) that the sandbox's user can run: this one when it can (as root, this
    one may live where an unprivileged user cannot read, e.g. under /root), else the system's.
    Set TOKENROUTER_SANDBOX_PYTHON to choose."""
    key = uid is not None
    with _python_lock:
        if key not in _python_cache:
            why = {}
            for candidate in _candidates():
                why[candidate] = _probe(candidate, uid)
                if why[candidate] is None:
                    _python_cache[key] = candidate
                    break
            else:
                who = f"uid {uid}" if uid is not None else "this user"
                tried = "; ".join(f"{p}: {w}" for p, w in why.items()) or "none found"
                raise SandboxError(
                    f"no Python interpreter that {who} can run ({tried}); set {PYTHON_ENV} to one, e.g. "
                    "/usr/bin/python3" + (" (or the uid cannot be used here)" if uid is not None else "")
                )
        return _python_cache[key]


def _uid_free(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
        return False
    except KeyError:
        return True


@contextlib.contextmanager
def uid_slot():
    """A uid no account and no other sandbox run uses, held (a lock file under the store home,
    where sandboxed code cannot reach) until the program and everything it started are gone."""
    import fcntl

    locks = store.home_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 600
    global _next_slot
    while True:
        with _python_lock:  # round robin: a slot's dead processes get time to be reaped (they count
            start, _next_slot = _next_slot, (_next_slot + 1) % UID_SLOTS  # against its RLIMIT_NPROC)
        for i in range(UID_SLOTS):
            uid = UID_BASE + (start + i) % UID_SLOTS
            if not _uid_free(uid):
                continue
            f = open(locks / f"sandbox-uid-{uid}.lock", "a+b")  # noqa: SIM115 (held across the yield)
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            try:
                kill_uid(uid)  # a leftover of a run that was itself killed
                yield uid
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                f.close()
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"all {UID_SLOTS} sandbox uids from {UID_BASE} stayed busy for 10 minutes")
        time.sleep(0.05)


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) pids whose real or effective uid is `uid` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue  # already dead, waiting to be reaped: nothing to kill
        real, effective = fields.get("Uid", "-1 -1").split()[:2]
        if uid in (int(real), int(effective)):
            pids.append(int(entry))
    return pids


def kill_uid(uid: int, timeout: float = 5.0) -> bool:
    """Kill every process of `uid`: `kill(-1, SIGKILL)` sent by a process running as that uid
    reaches all of them at once, whatever session or group they moved to. True when none is left."""
    deadline = time.monotonic() + timeout
    while processes_of(uid):
        try:
            subprocess.run(
                [interpreter(uid), "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
                user=uid,
                group=uid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                cwd="/",
                env=minimal_env("/"),
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass
        if time.monotonic() > deadline:
            return not processes_of(uid)
        time.sleep(0.01)  # killed processes leave /proc once reaped
    return True


def remove_leftovers(uid: int) -> None:
    """What the program's uid left in the shared scratch directories (it could write there only
    without the audit hook, or around it)."""
    for scratch in SCRATCH_DIRS:
        try:
            entries = list(os.scandir(scratch))
        except OSError:
            continue
        for e in entries:
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except OSError:
                continue


def scratch_parent() -> str:
    """Where a program running as another uid can reach its directory: the system's temporary
    directory when every directory above it can be passed through (TMPDIR may be private)."""
    for d in (tempfile.gettempdir(), *SCRATCH_DIRS):
        p = Path(d).resolve()
        if p.is_dir() and all(q.stat().st_mode & 0o001 for q in (p, *p.parents)):
            return str(p)
    raise SandboxError(
        f"no temporary directory that another user can reach (tried TMPDIR and {', '.join(SCRATCH_DIRS)})"
    )


__all__ = [
    "PYTHON_ENV",
    "SCRATCH_DIRS",
    "UID_BASE",
    "UID_SLOTS",
    "interpreter",
    "kill_uid",
    "minimal_env",
    "processes_of",
    "remove_leftovers",
    "scratch_parent",
    "uid_slot",
]
