"""Run untrusted generated code so that it can fail only itself.

A model's answer is code nobody has read. Each program runs in its own process, in layers, so
that one layer's gap is covered by another:

1. **A separate process** (`python -I -S -B`: no environment variables, no user or site
   packages, no bytecode written), stdin closed, a minimal environment, in a fresh temporary
   directory that is its cwd, HOME and TMPDIR.
2. **A wall-clock timeout** (default 10 s); then its whole process group is killed.
3. **Resource limits**, set by the bootstrap before the program's first line runs: address space
   (RLIMIT_AS), CPU seconds (RLIMIT_CPU), file size (RLIMIT_FSIZE, which also bounds what it can
   print: stdout and stderr are files), processes (RLIMIT_NPROC), open files, no core dumps.
4. **Another user.** Root ignores RLIMIT_NPROC and every file permission, and CI runs as root.
   Run as root, each program gets an unprivileged uid/gid of its own (one of `UID_SLOTS` numbers
   from `UID_BASE` that no account uses, held with a lock file for the run), owning only its
   directory. RLIMIT_NPROC then counts only that program's processes; when it ends, every
   process of that uid is killed (`kill(-1, SIGKILL)` sent as that uid: nothing escapes by
   leaving the process group), and what it left in /tmp, /var/tmp and /dev/shm is removed.
5. **An audit hook** (`sys.addaudithook`, installed by the bootstrap; a program cannot remove
   it) refusing writes, renames, removals, links and permission changes outside its directory,
   process creation (fork, exec, posix_spawn, os.system, subprocess), signals, socket use,
   ctypes and rlimit changes. Python code in the same process can work around a hook with
   enough effort (the kernel-level layers above are what hold then); it stops the accidents and
   the obvious attempts with a clear PermissionError.

The verdict comes from the bootstrap, not from the exit status alone: it reports through an
inherited file whether the program ran to its end, so `sys.exit(0)` or `os._exit(0)` before the
tests finish is a failure, not a pass. A program that wants to lie (write the bootstrap's verdict
itself) can: this is a guard against accidents and sloppy code, not against an adversary who
targets this harness. docs/evaluation.md says what it does not protect against.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import store
from ..errors import TokenRouterError

UID_BASE = 64200  # the sandbox's own uids when run as root: UID_BASE .. UID_BASE + UID_SLOTS - 1
UID_SLOTS = 64
PYTHON_ENV = "TOKENROUTER_SANDBOX_PYTHON"  # an interpreter to use instead of looking for one
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

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


# The bootstrap: trusted code that runs first in the child, then runs the program. It reads its
# settings from argv[1] (JSON) and reports on the inherited file descriptor `fd`.
BOOTSTRAP = r"""
import sys, os, json, resource
cfg = json.loads(sys.argv[1])
report = os.fdopen(cfg["fd"], "w", encoding="utf-8")
with open(cfg["program"], encoding="utf-8") as f:
    source = f.read()
def limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))
limit(resource.RLIMIT_CORE, 0)
limit(resource.RLIMIT_AS, cfg["memory"])
limit(resource.RLIMIT_CPU, cfg["cpu"])
limit(resource.RLIMIT_FSIZE, cfg["fsize"])
limit(resource.RLIMIT_NPROC, cfg["nproc"])
limit(resource.RLIMIT_NOFILE, cfg["nofile"])
try:  # die with the harness: a sleeping program is not stopped by RLIMIT_CPU
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    del ctypes
except Exception:
    pass
for name in ("ctypes", "_ctypes", "ctypes._endian"):
    sys.modules.pop(name, None)
try:
    code = compile(source, "program.py", "exec")
except (SyntaxError, ValueError) as e:
    report.write("syntax_error " + (type(e).__name__ + ": " + str(e)).replace("\n", " ")[:500] + "\n")
    report.flush()
    os._exit(3)
if cfg["hook"]:
    import _posixsubprocess
    def _refused(*args, **kwargs):
        raise PermissionError("sandbox: creating processes is not allowed")
    _posixsubprocess.fork_exec = _refused
    root = os.path.realpath(cfg["root"])
    realpath, isabs, fspath, fsdecode, sep = os.path.realpath, os.path.isabs, os.fspath, os.fsdecode, os.sep
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    # event: (positions of paths, positions of dir_fd arguments)
    PATHS = {
        "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
        "os.rename": ((0, 1), (2, 3)), "os.symlink": ((0, 1), (2,)), "os.link": ((0, 1), (2, 3)),
        "os.truncate": ((0,), ()), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
        "os.utime": ((0,), (3,)), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
        "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()), "os.mkfifo": ((0,), (2,)),
        "os.mknod": ((0,), (3,)), "shutil.rmtree": ((0,), (1,)), "shutil.move": ((0, 1), ()),
        "shutil.copyfile": ((1,), ()), "shutil.copytree": ((1,), ()),
    }
    REFUSED = {
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
        "resource.prlimit", "sys.remote_exec", "pty.spawn",
    }
    REFUSED_PREFIXES = ("socket.", "ctypes.")
    REFUSED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess"}
    busy = []
    def inside(p):
        if p is None or isinstance(p, int):
            return True  # an open file descriptor: opening it was checked
        p = realpath(fsdecode(fspath(p)))
        return p == root or p.startswith(root + sep)
    def hook(event, args):
        if busy:  # events raised by this hook's own calls
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = bool((flags or 0) & WRITE) or any(c in (mode or "") for c in "wax+")
            if writes and mode is None and not isinstance(path, int) and not isabs(fsdecode(fspath(path))):
                # os.open's event does not say its dir_fd: only an absolute path says where it writes
                raise PermissionError("sandbox: os.open for writing needs an absolute path (or use open())")
            if not writes:
                return
            busy.append(1)
            try:
                ok = inside(path)
            finally:
                busy.pop()
            if not ok:
                raise PermissionError(f"sandbox: writing outside the sandbox directory is not allowed: {path!r}")
        elif event in PATHS:
            paths, dir_fds = PATHS[event]
            if any(i < len(args) and args[i] not in (None, -1) for i in dir_fds):
                raise PermissionError(f"sandbox: {event} relative to a directory descriptor is not allowed")
            busy.append(1)
            try:
                ok = all(inside(args[i]) for i in paths if i < len(args))
            finally:
                busy.pop()
            if not ok:
                raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed: {args[0]!r}")
        elif event in REFUSED or event.startswith(REFUSED_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event == "import" and args[0] in REFUSED_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    sys.addaudithook(hook)
    del hook
del cfg, source, f, limit
namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
try:
    exec(code, namespace)
except BaseException as e:
    import traceback
    traceback.print_exc()
    report.write("failed " + (type(e).__name__ + (": " + str(e) if str(e) else "")).replace("\n", " ")[:500] + "\n")
    report.flush()
    sys.stdout.flush()
    os._exit(1)
sys.stdout.flush()
sys.stderr.flush()
report.write("passed\n")
report.flush()
os._exit(0)
"""


# ---- the interpreter and the uid ---------------------------------------------------------------
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
            env=_env("/"),
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
def _uid_slot():
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
                env=_env("/"),
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass
        if time.monotonic() > deadline:
            return not processes_of(uid)
        time.sleep(0.01)  # killed processes leave /proc once reaped
    return True


def _remove_leftovers(uid: int) -> None:
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


def _scratch_parent() -> str:
    """Where a program running as another uid can reach its directory: the system's temporary
    directory when every directory above it can be passed through (TMPDIR may be private)."""
    for d in (tempfile.gettempdir(), *SCRATCH_DIRS):
        p = Path(d).resolve()
        if p.is_dir() and all(q.stat().st_mode & 0o001 for q in (p, *p.parents)):
            return str(p)
    raise SandboxError(
        f"no temporary directory that another user can reach (tried TMPDIR and {', '.join(SCRATCH_DIRS)})"
    )


# ---- one run -----------------------------------------------------------------------------------
def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _tail(f, limit: int) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")


def _rmtree(root: str) -> None:
    """Remove the program's directory. Without root's privileges a directory the program made
    unreadable is opened up first: never anything outside `root`."""

    def inside(p: str) -> bool:
        return os.path.commonpath([root, p]) == root

    def onerror(func, p, exc):
        if isinstance(exc[1], FileNotFoundError):
            return
        try:
            for q in (os.path.dirname(p), p):
                if inside(q) and not os.path.islink(q):
                    os.chmod(q, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(root, onerror=onerror)


def run_program(code: str, limits: Limits | None = None) -> Outcome:
    """Run `code` in the sandbox and return its outcome. Blocks (run it in a thread from async
    code). A SandboxError means the sandbox cannot run anything here, not that `code` failed."""
    limits = limits or Limits()
    as_root = os.geteuid() == 0 and limits.drop_privileges
    slot = _uid_slot() if as_root else contextlib.nullcontext(None)
    with slot as uid:
        python = interpreter(uid)
        # <parent>/work: the parent is ours (0711: the program may pass through it, not list it),
        # the work directory the program's, and nothing else is.
        parent = tempfile.mkdtemp(prefix="tokenrouter-sandbox-", dir=_scratch_parent() if uid is not None else None)
        try:
            work = os.path.join(parent, "work")
            os.mkdir(work, 0o700)
            if uid is not None:
                os.chmod(parent, 0o711)
                os.chown(work, uid, uid)
            program = os.path.join(work, "program.py")
            with open(program, "w", encoding="utf-8") as f:
                f.write(code)
            os.chmod(program, 0o644)
            if uid is not None:
                os.chown(program, uid, uid)  # its own file: where it moves it, the clean-up finds it
            return _run(python, program, work, uid, limits)
        finally:
            if uid is not None:
                kill_uid(uid)
            _rmtree(parent)
            if uid is not None:
                _remove_leftovers(uid)


def _run(python: str, program: str, work: str, uid: int | None, limits: Limits) -> Outcome:
    cfg = {
        "program": program,
        "root": work,
        "memory": limits.memory_bytes,
        "cpu": limits.cpu_limit,
        "fsize": limits.file_bytes,
        "nproc": limits.processes,
        "nofile": limits.open_files,
        "hook": limits.audit_hook,
    }
    ids = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as verdict:
        cfg["fd"] = verdict.fileno()
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(verdict.fileno(),),
                cwd=work,
                env=_env(work),
                start_new_session=True,
                umask=0o077,
                **ids,
            )
        except OSError as e:
            raise SandboxError(f"cannot start {python} in the sandbox: {e}") from e
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its group, whether it ended or not
            proc.wait()
        duration = time.perf_counter() - t0
        verdict.seek(0)
        said = verdict.read(2048).decode("utf-8", errors="replace").splitlines()
        stdout, stderr = _tail(out, limits.output_bytes), _tail(err, limits.output_bytes)
    rc = proc.returncode
    line = said[-1] if said else ""
    word, _, detail = line.partition(" ")
    if timed_out:
        status, error = "timeout", f"timed out after {limits.timeout_s:g} s (killed)"
    elif word == "passed" and rc == 0:
        status, error = "passed", ""
    elif word == "syntax_error":
        status, error = "syntax_error", detail
    elif word == "failed":
        status, error = "failed", detail
    elif rc is not None and rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        cpu = sig in ("SIGXCPU", "SIGKILL")
        status = "timeout" if cpu else "failed"
        error = f"killed by {sig}" + (f" (CPU time limit {limits.cpu_limit} s)" if cpu else "")
    else:
        status, error = "failed", f"exited before the tests finished (exit status {rc})"
    return Outcome(status, error, rc, duration, stdout, stderr, uid)


__all__ = [
    "BOOTSTRAP",
    "UID_BASE",
    "UID_SLOTS",
    "Limits",
    "Outcome",
    "SandboxError",
    "interpreter",
    "kill_uid",
    "processes_of",
    "run_program",
]
