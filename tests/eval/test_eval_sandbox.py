"""The sandbox that runs generated code: a bad program fails only itself.

Each layer is checked on its own where it can be: the audit hook with the other layers on, and
the kernel-level layers (a uid of its own, rlimits, the process group) with the hook off, as a
program that gets around the hook would meet them.
"""

import os
import time
from pathlib import Path

import pytest

from tokenrouter.eval import Limits, run_program
from tokenrouter.eval.sandbox_uid import processes_of

FAST = Limits(timeout_s=1.5, memory_bytes=512 << 20)
NO_HOOK = Limits(timeout_s=1.5, memory_bytes=512 << 20, audit_hook=False)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox gives programs a uid of their own only as root")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def _sandbox_dirs() -> set[str]:
    return {p for p in os.listdir("/tmp") if p.startswith("tokenrouter-sandbox-")}


def test_a_passing_program_passes_and_its_directory_is_removed():
    before = _sandbox_dirs()
    out = run_program("def f(x):\n    return x + 1\n\nassert f(1) == 2\nprint('ok')\n", FAST)
    assert out.status == "passed" and out.passed, out
    assert out.stdout == "ok\n"
    assert _sandbox_dirs() <= before


def test_a_failing_program_fails_with_its_exception():
    out = run_program("def check(c):\n    assert c(2) == 5, 'wrong'\n\ncheck(lambda x: x)\n", FAST)
    assert out.status == "failed"
    assert out.error == "AssertionError: wrong"
    assert "Traceback" in out.stderr


def test_a_syntax_error_is_reported_as_such():
    out = run_program("def f(:\n    return 1\n", FAST)
    assert out.status == "syntax_error"
    assert out.error.startswith("SyntaxError")


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"])
def test_leaving_before_the_tests_end_is_not_a_pass(exit_call):
    out = run_program(f"{exit_call}\nassert False\n", FAST)
    assert out.status == "failed", out


@pytest.mark.parametrize("body", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"])
def test_an_endless_program_is_killed_at_the_timeout(body):
    t0 = time.monotonic()
    out = run_program(body, FAST)
    took = time.monotonic() - t0
    assert out.status == "timeout", out
    assert "timed out" in out.error
    assert FAST.timeout_s <= took < FAST.timeout_s + 5


def test_the_cpu_limit_holds_without_the_wall_clock():
    out = run_program("while True:\n    pass\n", Limits(timeout_s=60, cpu_s=1, memory_bytes=512 << 20))
    assert out.status == "timeout" and "CPU time limit" in out.error, out
    assert out.duration_s < 30  # one CPU second, however loaded the machine


@pytest.mark.parametrize(
    "bomb",
    ["x = bytearray(1 << 40)\n", "chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))\n"],
    ids=["at-once", "growing"],
)
def test_a_memory_bomb_fails_only_itself(bomb):
    out = run_program(bomb, Limits(timeout_s=5, memory_bytes=256 << 20))
    assert out.status == "failed" and out.error.startswith("MemoryError"), out
    assert out.duration_s < 10


def test_output_is_bounded_by_the_file_size_limit():
    out = run_program("while True:\n    print('x' * 4096)\n", Limits(timeout_s=5, file_bytes=1 << 20))
    assert out.status == "failed", out
    assert len(out.stdout) <= FAST.output_bytes


def test_the_audit_hook_refuses_forks_and_processes():
    for code in (
        "import os\nwhile True:\n    os.fork()\n",
        "import subprocess\nsubprocess.run(['true'])\n",
        "import os\nos.system('true')\n",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})\n",
        "import os\nos.execv('/bin/true', ['true'])\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
    ):
        out = run_program(code, FAST)
        assert out.status == "failed" and "PermissionError" in out.error and "not allowed" in out.error, (code, out)


def test_the_audit_hook_refuses_network_and_ctypes():
    for code in (
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))\n",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')\n",
        "import ctypes\n",
    ):
        out = run_program(code, FAST)
        assert out.status == "failed" and "not allowed" in out.error, (code, out)


@as_root
def test_a_fork_bomb_is_bounded_and_nothing_of_it_survives():
    """Without the hook (as a program that got around it would be): RLIMIT_NPROC bounds it, and
    every process of its uid is killed at the end, even one that left its process group."""
    code = (
        "import os, time\n"
        "print(os.getpid(), flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            print(os.getpid(), flush=True)\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    out = run_program(code, NO_HOOK)
    assert out.status == "timeout", out
    pids = [int(p) for p in out.stdout.split()]
    assert 1 < len(pids) <= NO_HOOK.processes
    assert out.uid is not None and out.uid != 0
    assert processes_of(out.uid) == []
    assert not [p for p in pids if _alive(p)]


def test_a_forked_child_left_behind_is_killed(tmp_path):
    """A program that forks a sleeper and returns: the sleeper does not outlive the run."""
    code = (
        "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nprint(pid, flush=True)\n"
    )
    out = run_program(code, NO_HOOK)
    assert out.status == "passed", out
    assert not _alive(int(out.stdout.split()[0]))


@pytest.mark.parametrize("hook", [True, False], ids=["hook", "no-hook"])
def test_writing_outside_its_directory_creates_nothing(tmp_path, hook):
    if not hook and os.geteuid() != 0:
        pytest.skip("without the hook, only a uid of its own keeps it out (as root)")
    targets = [tmp_path / "escaped.txt", Path("/tmp") / f"tokenrouter-escape-{os.getpid()}-{hook}.txt"]
    tmp_path.chmod(0o777)  # even a directory anyone may write to is out of its reach
    code = "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\nexcept OSError as e:\n    print(type(e).__name__)\n"
        for t in targets
    )
    code += (
        "import os, shutil\n"
        "for f in (lambda: os.rename('program.py', '/tmp/moved.py'), lambda: os.mkdir('/tmp/made-by-sandbox'),\n"
        "          lambda: shutil.copyfile('program.py', '/tmp/copied-by-sandbox')):\n"
        "    try:\n        f()\n    except OSError as e:\n        print(type(e).__name__)\n"
        "open('inside.txt', 'w').write('fine')\n"
    )
    out = run_program(code, FAST if hook else NO_HOOK)
    assert out.status == "passed", out
    for t in targets:
        assert not t.exists(), t
    for leftover in ("/tmp/moved.py", "/tmp/made-by-sandbox", "/tmp/copied-by-sandbox"):
        assert not os.path.exists(leftover), leftover
    if hook:
        assert out.stdout.split() == ["PermissionError"] * 5


def test_writing_through_a_symlink_out_of_its_directory_is_refused(tmp_path):
    target = tmp_path / "through-link.txt"
    code = f"import os\nos.symlink({str(tmp_path)!r}, 'out')\nopen('out/through-link.txt', 'w').write('x')\n"
    out = run_program(code, FAST)
    assert out.status == "failed" and "PermissionError" in out.error
    assert not target.exists()


@as_root
def test_it_runs_as_a_uid_of_its_own_with_a_minimal_environment():
    code = "import os, sys\nprint(os.getuid(), os.getgid(), os.getgroups(), sorted(os.environ), sys.flags.isolated)\n"
    out = run_program(code, FAST)
    assert out.status == "passed", out
    uid, gid, *_ = out.stdout.split()
    assert int(uid) == out.uid and int(gid) == out.uid and out.uid != 0
    assert "[]" in out.stdout  # no supplementary groups
    assert "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']" in out.stdout
    assert out.stdout.split()[-1] == "1"


def test_temporary_files_work_inside_and_dir_fd_tricks_do_not(tmp_path):
    code = (
        "import os, tempfile\n"
        "with tempfile.TemporaryFile() as f:\n    f.write(b'x')\n"
        "fd, name = tempfile.mkstemp()\nos.close(fd)\nassert name.startswith(os.getcwd())\n"
        f"d = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        "os.open('made-by-dir-fd', os.O_WRONLY | os.O_CREAT, dir_fd=d)\n"
    )
    out = run_program(code, Limits(timeout_s=1.5, drop_privileges=False))  # the hook alone, able to reach tmp_path
    assert out.status == "failed" and "needs an absolute path" in out.error, out
    assert not (tmp_path / "made-by-dir-fd").exists()


def test_stdin_is_closed():
    out = run_program("import sys\nassert sys.stdin.read() == ''\ninput()\n", FAST)
    assert out.status == "failed" and out.error.startswith("EOFError"), out


def test_limits_are_checked():
    with pytest.raises(ValueError, match="timeout_s"):
        Limits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        Limits(memory_bytes=0)
