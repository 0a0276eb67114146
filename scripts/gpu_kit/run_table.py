"""The compact table the device run prints last (and `gpu_kit table OUT` prints again from what came back):
each stage's status and time, then the headline numbers: routed tok/s by level beside each system's small and
large token counts, and the decode step against the memory floor."""

from __future__ import annotations

import json
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def table(out: Path) -> list[str]:
    lines = []
    summary = _load(out / "summary.json") or {}
    lines.append(
        f"device {summary.get('device')}; attention {summary.get('attention_backend')}, prefill "
        f"{summary.get('prefill_backend')}; {summary.get('elapsed_s')} s of {summary.get('budget_s')}"
        + ("" if summary.get("finished") else " (NOT FINISHED)")
    )
    for s in summary.get("stages", []):
        lines.append(
            f"  {s['stage']:<12} {s['status']:<28} {s['wall_s']:6.1f} s of {s['cap_s']:3d} s  {s.get('note', '')}"
        )
    if summary.get("cut"):
        lines.append(f"  cut: {', '.join(summary['cut'])}")
    for f in summary.get("fallbacks", []):
        lines.append(f"  !! {f}")
    for name in ("routed.json", "routed-eager.json", "routed-fa3.json"):
        routed = _load(out / "bench" / name)
        if routed:
            lines += routed_lines(name, routed)
    decode = _load(out / "bench" / "decode.json")
    if decode:
        lines += decode_lines(decode)
    return lines


def routed_lines(name: str, routed: dict) -> list[str]:
    """tok/s per level and system, the ratio to lockstep, and who wrote the tokens (small/large, hand-offs)."""
    out = [f"{name}: C, system, tok/s, x lockstep, tokens small/large, hand-offs"]
    by_level: dict[int, dict[str, dict]] = {}
    for s in routed.get("summaries", []):
        by_level.setdefault(s["concurrency"], {})[s["system"]] = s["metrics"]
    for c, systems in by_level.items():
        base = (systems.get("lockstep") or {}).get("tok_per_s")
        for system, m in systems.items():
            tokens = m.get("tokens_by_model") or {}
            ratio = f"{m['tok_per_s'] / base:.2f}" if base else "-"
            out.append(
                f"  C={c:<3} {system:<12} {m['tok_per_s']:8.1f}  {ratio:>5}  "
                f"{tokens.get('small', 0)}/{tokens.get('large', 0)}  {m.get('handoffs', 0)}"
            )
    return out


def decode_lines(decode: dict) -> list[str]:
    out = ["decode.json: model, B, mode, ms a step, x the memory floor"]
    for r in decode.get("measurements", []):
        ms = r.get("ms")
        out.append(
            f"  {r['model']:<6} B={r['batch']:<3} {r['mode']:<6} "
            + (f"{ms:8.3f} ms  {r['x_floor']:.2f}x of {r['floor_ms']:.3f}" if ms is not None else r.get("skipped", "-"))
        )
    return out


def cmd_table(args) -> int:
    for line in table(Path(args.out)):
        print(line)
    return 0
