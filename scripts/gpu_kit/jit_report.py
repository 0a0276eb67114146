"""`jit-report`, the report stage: the flashinfer modules the JIT built, against those the jit stages
foresaw."""

from __future__ import annotations

import json
from pathlib import Path

from .console import say


def jit_report(built: list[str], warm_reports: list[dict], prefill_backend: str) -> dict:
    """What the JIT built against what the jit stages foresaw: `not_in_warm` (a module then compiled inside a
    timed stage: it belongs in WARM_FA2 or WARM_FA3) and `warm_missing` (foreseen but not built)."""
    warmed = [m for r in warm_reports for m in r.get("modules", [])]
    return {
        "prefill_backend": prefill_backend,
        "built": built,
        "warmed": warmed,
        "not_in_warm": [m for m in built if m not in warmed],
        "warm_missing": [m for m in warmed if m not in built],
        "fa3_built": [m for m in built if m.endswith("_sm90")],
    }


def cmd_jit_report(args) -> int:
    from flashinfer.jit import env

    built = sorted(p.parent.name for p in env.FLASHINFER_JIT_DIR.glob("*/*.so"))
    reports = [json.loads(Path(w).read_text()) for w in args.warm_json if Path(w).is_file()]
    out = {"jit_dir": str(env.FLASHINFER_JIT_DIR), **jit_report(built, reports, args.prefill_backend)}
    say(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0
