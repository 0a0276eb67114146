"""`preflight`, the first stage on the GPU: a pinned round trip, a one-kernel CUDA graph captured and
replayed on a side stream, and `import flashinfer`, each timed, every failure kept; the exit status says
which of the later stages can use what."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .console import say


def preflight() -> tuple[int, dict]:
    """(exit status, report): 0 all well, 1 a CUDA part failed (flashinfer imports), 2 flashinfer failed to import.
    Each part is timed and any exception kept with its traceback's last lines."""
    import traceback

    report: dict = {}

    def part(name, fn):
        t0 = time.perf_counter()
        try:
            report[name] = {"ok": True, **(fn() or {})}
        except BaseException as e:  # noqa: BLE001 - the pre-flight reports every failure, whatever its kind
            if isinstance(e, KeyboardInterrupt):
                raise
            report[name] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
        report[name]["s"] = round(time.perf_counter() - t0, 2)

    def pinned():
        import torch

        host = torch.arange(1 << 20, dtype=torch.int32).pin_memory()  # 4 MiB, page-locked
        dev = host.to("cuda", non_blocking=True)
        back = torch.empty_like(host).pin_memory()
        back.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        if not torch.equal(back, host):
            raise RuntimeError("a pinned round trip through the GPU changed the data")
        return {"bytes": host.numel() * 4, "device": torch.cuda.get_device_name(0)}

    def graph():
        import torch

        side = torch.cuda.Stream()
        x = torch.ones(4096, device="cuda")
        y = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mul(x, 2, out=y)  # the warm-up, on the stream that captures
        side.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side, capture_error_mode="thread_local"):
            torch.mul(x, 2, out=y)  # one kernel
        x.fill_(3.0)  # on the current stream: the side stream waits for it
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            g.replay()
        side.synchronize()
        if float(y[0]) != 6.0 or float(y[-1]) != 6.0:
            raise RuntimeError(f"the replayed graph wrote {float(y[0])}, not 6.0")
        return {"stream": "side", "capture_error_mode": "thread_local"}

    def flashinfer():
        import flashinfer

        return {"version": flashinfer.__version__, "file": flashinfer.__file__}

    part("pinned", pinned)
    part("graph", graph)
    part("flashinfer", flashinfer)
    part("toolkit", toolkit)
    rc = 2 if not report["flashinfer"]["ok"] else 0 if report["pinned"]["ok"] and report["graph"]["ok"] else 1
    return rc, report


def toolkit() -> dict:
    """What a JIT build would need, should an AOT module fail to load: the CUDA home flashinfer would pick,
    nvcc's version, cuRAND's header (FA3 includes it), a one-second link with `-lcuda` as the JIT links, and
    the cores and memory that size its nvcc jobs. Raises where the link fails."""
    import glob
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    from .nvcc_jobs import FA2_JOB_BYTES, max_jobs, mem_available

    nvcc = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    home = home or (os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda")
    version = subprocess.run([f"{home}/bin/nvcc", "--version"], capture_output=True, text=True, timeout=20).stdout
    curand = [f"{home}/include/curand_kernel.h"] + glob.glob(
        f"{sys.prefix}/lib/python3*/site-packages/nvidia/*/include/curand_kernel.h"
    )
    import torch

    mem = mem_available()
    out = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cuda_home": home,
        "nvcc": version.strip().splitlines()[-1] if version else None,
        "curand_kernel_h": [c for c in curand if os.path.isfile(c)],
        "cores": os.cpu_count(),
        "mem_available_gib": round(mem / 2**30, 1) if mem else None,
        "jit_jobs_fa2": max_jobs(os.cpu_count() or 1, mem, FA2_JOB_BYTES),
    }
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "empty.c")
        open(src, "w").write("int tokenrouter_link_test(void) { return 0; }\n")
        link = ["c++", "-shared", "-fPIC", src, f"-L{home}/lib64", f"-L{home}/lib64/stubs", "-lcudart", "-lcuda"]
        proc = subprocess.run([*link, "-o", os.path.join(tmp, "t.so")], capture_output=True, text=True, timeout=30)
        out["link_cuda"] = proc.returncode == 0
        if proc.returncode != 0:
            raise RuntimeError(f"linking with -lcuda as the JIT does failed: {proc.stderr[-500:]} ({out})")
    return out


def cmd_preflight(args) -> int:
    rc, report = preflight()
    for name, r in report.items():
        say(f"preflight {name}: " + ("ok" if r["ok"] else f"FAILED: {r['error']}") + f" ({r['s']} s)")
        if not r["ok"]:
            say(r["traceback"])
    if args.json:
        Path(args.json).write_text(json.dumps({"rc": rc, **report}, indent=1))
    return rc
