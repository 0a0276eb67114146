"""`warm`, the jit-fa2 and jit-fa3 stages: build one part of our flashinfer kernels in one parallel ninja run,
then load each, so that no timed stage compiles one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .console import say
from .jit_modules import warm_specs


def cmd_warm(args) -> int:
    """Build one part of the flashinfer modules the kit's runs need in one ninja run, MAX_JOBS nvcc jobs at
    once (flashinfer would otherwise build each at first use, one after the other), then load each."""
    import torch

    t0 = time.perf_counter()
    import flashinfer
    from flashinfer.jit.core import build_jit_specs

    device = torch.device("cuda:0")
    specs = warm_specs(args.part, device)
    say(
        f"warm {args.part}: flashinfer {flashinfer.__version__} imported in {time.perf_counter() - t0:.1f} s; building "
        f"{len(specs)} modules with MAX_JOBS={os.environ.get('MAX_JOBS', 'ninja default')}, "
        f"FLASHINFER_NVCC_THREADS={os.environ.get('FLASHINFER_NVCC_THREADS', '1 (default)')}:"
    )
    for s in specs:
        say(f"  {s.name}")
    t1 = time.perf_counter()
    if specs:
        build_jit_specs(specs, verbose=False)
    t2 = time.perf_counter()
    for s in specs:
        s.build_and_load()
    t3 = time.perf_counter()
    result = {
        "part": args.part,
        "modules": [s.name for s in specs],
        "build_s": round(t2 - t1, 1),
        "load_s": round(t3 - t2, 1),
    }
    say(f"warm {args.part}: built in {t2 - t1:.0f} s, loaded in {t3 - t2:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0
