"""`summary`: summary.json (the stages with their caps, times and exit statuses, the attention backend, the
fallbacks, the results) and the stage times printed at the end of the run."""

from __future__ import annotations

import json
from pathlib import Path

from .console import say


def cmd_summary(args) -> int:
    """summary.json from the stage table (name, cap, seconds, exit status, note per line) and the results."""
    out_dir = Path(args.out)
    stages = []
    for line in Path(args.stages).read_text().splitlines():
        name, cap, seconds, rc, note = (line.split("\t") + [""] * 5)[:5]
        stages.append({"stage": name, "cap_s": int(cap), "wall_s": float(seconds), "rc": int(rc), "note": note})
    extra = {}
    for item in args.include:  # key=path
        key, _, name = item.partition("=")
        p = Path(name)
        if p.is_file():
            try:
                extra[key] = json.loads(p.read_text())
            except ValueError:
                extra[key] = p.read_text()[-2000:]
    summary = {
        "attention_backend": args.attention,
        "prefill_backend": args.prefill_backend if args.attention == "flashinfer" else None,
        "fallbacks": args.fallback,
        "total_s": args.wall if args.wall is not None else round(sum(s["wall_s"] for s in stages), 1),
        "stages": stages,
        "results": sorted(p.name for p in out_dir.glob("*.json") if p.name != "summary.json"),
        **extra,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    width = max(len(s["stage"]) for s in stages) if stages else 5
    say("stage times:")
    for s in stages:
        state = "ok" if s["rc"] == 0 else ("timed out" if s["rc"] in (124, 137) else f"exit {s['rc']}")
        say(f"  {s['stage']:<{width}}  {s['wall_s']:6.1f} s of {s['cap_s']:3d} s  {state}  {s['note']}")
    say(
        f"  {'total':<{width}}  {summary['total_s']:6.1f} s (models runs beside jit); "
        f"attention backend: {args.attention}"
        + (f", prefill {args.prefill_backend}" if args.attention == "flashinfer" else "")
    )
    for f in args.fallback:
        say(f"  !! {f}")
    return 0
