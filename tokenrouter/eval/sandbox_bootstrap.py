"""The child's side of the sandbox: trusted code that runs first in the program's process, sets
the resource limits and the audit hook (layers 3 and 5 of sandbox.py), then runs the program and
writes its verdict to an inherited file; and `verdict`, which reads that file back. Kept together
because they are the two ends of one protocol (a first word: passed, failed, syntax_error).
"""

from __future__ import annotations

import signal

from .sandbox_limits import Limits, Status

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


def verdict(report: list[str], returncode: int | None, timed_out: bool, limits: Limits) -> tuple[Status, str]:
    """(status, one-line error) of a program from the lines the bootstrap reported, its exit
    status and whether the harness killed it at the timeout. The bootstrap's word counts only with
    the exit status that goes with it: a program that ended early did not pass."""
    rc = returncode
    line = report[-1] if report else ""
    word, _, detail = line.partition(" ")
    if timed_out:
        return "timeout", f"timed out after {limits.timeout_s:g} s (killed)"
    if word == "passed" and rc == 0:
        return "passed", ""
    if word == "syntax_error":
        return "syntax_error", detail
    if word == "failed":
        return "failed", detail
    if rc is not None and rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        cpu = sig in ("SIGXCPU", "SIGKILL")
        error = f"killed by {sig}" + (f" (CPU time limit {limits.cpu_limit} s)" if cpu else "")
        return ("timeout" if cpu else "failed"), error
    return "failed", f"exited before the tests finished (exit status {rc})"


__all__ = ["BOOTSTRAP", "verdict"]
