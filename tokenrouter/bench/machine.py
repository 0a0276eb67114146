"""What the benchmark ran on, recorded with every result: numbers mean little without it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_level() -> dict:
    """The CPU level the engine's kernels ran at (TOKENROUTER_CPU_LEVEL may pin it below the CPU's),
    the CPU's own flags, and torch's own vector level: a CPU figure is one level's."""
    from ..engine import cpu_flags, cpu_level, torch_capability

    level = cpu_level()
    return {
        "cpu_level": level.level,
        "cpu_offers": level.offered,
        "cpu_level_pinned": level.pinned,
        "torch_cpu_capability": torch_capability(),
        "cpu_flags": sorted(cpu_flags()),
    }


def machine_info() -> dict:
    import importlib.metadata

    import torch
    import transformers

    mem = _first("/proc/meminfo", "MemTotal")
    info = {
        "platform": platform.platform(),
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory_gib": round(int(mem.split()[0]) / 2**20, 1) if mem else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenrouter": importlib.metadata.version("tokenrouter"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **cpu_level(),
    }
    try:
        root = Path(__file__).resolve().parents[2]
        git = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, capture_output=True, text=True, timeout=5, check=False)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


class CpuMeter:
    """CPU used during a run, in cores: by this process, and by everything else on the machine.

    Other processes on a shared small box distort every number; `foreign_cores` shows it."""

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @classmethod
    def _busy_s(cls) -> float | None:
        try:
            with open("/proc/stat") as f:
                vals = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return (sum(vals[:8]) - idle) / cls._TICK

    def __enter__(self) -> CpuMeter:
        self.t0, self.b0 = time.perf_counter(), self._busy_s()
        t = os.times()
        self.c0 = t.user + t.system
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t0
        t = os.times()
        own = t.user + t.system - self.c0
        b1 = self._busy_s()
        self.self_cores = own / wall
        self.foreign_cores = max(0.0, (b1 - self.b0 - own) / wall) if b1 is not None and self.b0 is not None else 0.0
