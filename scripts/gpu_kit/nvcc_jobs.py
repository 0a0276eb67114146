"""`max-jobs`: how many nvcc jobs the JIT may run at once: one a core, fewer where memory is short."""

from __future__ import annotations

import os
from pathlib import Path

# Peak resident memory of one nvcc job of the JIT, measured here (nvcc 13.0.88, the JIT's flags for sm_90a,
# head_dim 128): an FA3 kernel instantiation 3.5 GiB, FA3's batch_prefill_sm90.cu 1.7 GiB, an FA2 kernel
# 0.46 GiB. `max-jobs` allows 4 GiB a job and keeps MEM_RESERVE free for the random-weight pair written beside.
NVCC_JOB_BYTES = 4 << 30
FA2_JOB_BYTES = 1 << 29  # the JIT fallback builds FA2 only (FA3 travels prebuilt or is left out): 0.5 GiB a job
MEM_RESERVE = 16 << 30


def max_jobs(cores: int, mem_available: int | None, per_job: int = NVCC_JOB_BYTES, reserve: int = MEM_RESERVE) -> int:
    """nvcc jobs the JIT may run at once: one a core, fewer where the memory left after `reserve` does not hold
    `per_job` bytes for each (at least one). Unknown memory: the cores."""
    if mem_available is None:
        return max(1, cores)
    return max(1, min(cores, (mem_available - reserve) // per_job))


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cmd_max_jobs(args) -> int:
    cores = args.cores or os.cpu_count() or 1
    print(max_jobs(cores, mem_available(), FA2_JOB_BYTES if args.part == "fa2" else NVCC_JOB_BYTES))
    return 0
