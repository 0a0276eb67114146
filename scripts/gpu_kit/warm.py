"""`warm`, the kernels stages: load one part of our flashinfer modules, from the AOT set the kit carries where
it loads, else built by the JIT in one parallel ninja run, so that no timed stage compiles one; the report says
where each module came from."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .console import say
from .jit_modules import warm_specs


def cmd_warm(args) -> int:
    """Load each module of a part: its AOT library (`flashinfer/data/aot/<name>/<name>.so`, unpacked by the
    install stage) where that loads, else the JIT builds the rest in one ninja run, MAX_JOBS nvcc jobs at once,
    and loads them."""
    import torch

    t0 = time.perf_counter()
    import flashinfer
    from flashinfer.jit.core import build_jit_specs

    device = torch.device("cuda:0")
    specs = warm_specs(args.part, device)
    say(f"warm {args.part}: flashinfer {flashinfer.__version__} imported in {time.perf_counter() - t0:.1f} s")
    source: dict[str, str] = {}
    errors: dict[str, str] = {}
    t1 = time.perf_counter()
    for s in specs:
        if s.is_aot:
            try:
                if s.try_load() is not None:  # flashinfer logs and returns None when the library does not load
                    source[s.name] = "aot"
                    continue
                errors[s.name] = "the AOT library is there but did not load (flashinfer's warning above)"
            except Exception as e:  # noqa: BLE001 - any failure sends the module to the JIT, and is reported
                errors[s.name] = f"{type(e).__name__}: {e}"
        source[s.name] = "jit"
    t2 = time.perf_counter()
    jit = [s for s in specs if source[s.name] == "jit"]
    if jit:
        say(
            f"warm {args.part}: JIT-building {len(jit)} of {len(specs)} modules with "
            f"MAX_JOBS={os.environ.get('MAX_JOBS', 'ninja default')}: {', '.join(s.name for s in jit)}"
        )
        build_jit_specs(jit, verbose=False, skip_prebuilt=False)
        for s in jit:
            s.build_and_load()
    t3 = time.perf_counter()
    result = {
        "part": args.part,
        "modules": [s.name for s in specs],
        "source": source,
        "aot_errors": errors,
        "aot_load_s": round(t2 - t1, 2),
        "build_s": round(t3 - t2, 1),
    }
    for s in specs:
        say(f"  {s.name}: {source[s.name]}" + (f" ({errors[s.name]})" if s.name in errors else ""))
    say(f"warm {args.part}: {sum(v == 'aot' for v in source.values())} from AOT, {len(jit)} built in {t3 - t2:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0
