"""An optional py-spy profile of this process (bench_single.py --profile): raw stacks of every thread at
100 Hz, written when stopped. Nothing happens where py-spy is not installed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_log import log


class PySpy:
    """A running `py-spy record` on this process; `stop` ends it and so writes the profile."""

    def __init__(self, proc, path):
        self.proc, self.path = proc, path

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        log(f"py-spy profile written to {self.path}")


def start_profile(profile_dir: Path, name: str) -> PySpy | None:
    """py-spy on this process into PROFILE_DIR/NAME.txt, or None where py-spy is not found."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log("py-spy not found: no profile")
        return None
    profile_dir.mkdir(parents=True, exist_ok=True)
    path = profile_dir / f"{name}.txt"
    cmd = [
        exe,
        "record",
        "--pid",
        str(os.getpid()),
        "--format",
        "raw",
        "--rate",
        "100",
        "--threads",
        "--nonblocking",
        "-o",
        str(path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return PySpy(proc, path)
