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

This module runs one program (its directory, the process, the timeout, the clean-up); the terms
are in sandbox_limits.py, the child's side and its verdict in sandbox_bootstrap.py, the uid of
its own in sandbox_uid.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from .sandbox_bootstrap import BOOTSTRAP, verdict
from .sandbox_limits import Limits, Outcome, SandboxError
from .sandbox_uid import interpreter, kill_uid, minimal_env, remove_leftovers, scratch_parent, uid_slot


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
    slot = uid_slot() if as_root else contextlib.nullcontext(None)
    with slot as uid:
        python = interpreter(uid)
        # <parent>/work: the parent is ours (0711: the program may pass through it, not list it),
        # the work directory the program's, and nothing else is.
        parent = tempfile.mkdtemp(prefix="tokenrouter-sandbox-", dir=scratch_parent() if uid is not None else None)
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
                remove_leftovers(uid)


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
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as report:
        cfg["fd"] = report.fileno()
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", BOOTSTRAP, json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(report.fileno(),),
                cwd=work,
                env=minimal_env(work),
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
            if uid is not None:  # every process of its uid at once, before any slot frees: one
                kill_uid(uid)  # killed first would let a survivor fork (and print) into its slot
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its group, whether it ended or not
            proc.wait()
        duration = time.perf_counter() - t0
        report.seek(0)
        said = report.read(2048).decode("utf-8", errors="replace").splitlines()
        stdout, stderr = _tail(out, limits.output_bytes), _tail(err, limits.output_bytes)
    status, error = verdict(said, proc.returncode, timed_out, limits)
    return Outcome(status, error, proc.returncode, duration, stdout, stderr, uid)


__all__ = ["run_program"]
