#!/usr/bin/env python
"""README's first-run figure: its main-job command from a fresh clone with an empty store, as a
new user meets it. The repository is cloned into a temporary directory, the store is a new
empty directory, pip's cache is off (PIP_NO_CACHE_DIR=1), and the first bash block of README.md
runs there as written; every line it prints is stamped with the seconds since the start. The
phases (set-up, fetching each model, reading its config and tokenizer, loading, the answer) are
read off those lines.

    python benchmarks/anchors/readme_first_run.py --out benchmarks/results/readme/first-run.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_command() -> str:
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return blocks[0].strip()


def run(command: str, cwd: Path, env: dict) -> list[tuple[float, str]]:
    lines, t0 = [], time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in proc.stdout:
        if "WARNING: Location" not in line:  # pip's notes on this machine's local indexes
            lines.append((round(time.monotonic() - t0, 1), line.rstrip("\n")))
            print(f"[{lines[-1][0]:6.1f}] {lines[-1][1]}", file=sys.stderr)
    lines.append((round(time.monotonic() - t0, 1), f"exit {proc.wait()}"))
    return lines


def phases(lines: list[tuple[float, str]]) -> dict:
    """Seconds at which each phase ended, from the lines' stamps."""

    def first(pattern: str) -> float | None:
        return next((t for t, line in lines if re.search(pattern, line)), None)

    loaded = next((line for _, line in lines if re.search(r"loaded in [\d.]+ s", line)), "")
    summary = next((line for _, line in lines if "tokens/s" in line), "")
    return {
        "setup_done": first(r"\[tokenrouter\.store\]|^loading "),
        "small_fetched": first(r"verified .*qwen-coder-0\.5b"),
        "small_files": first(r"read the config and tokenizer of qwen-coder-0\.5b"),
        "large_fetched": first(r"verified .*qwen-coder-1\.5b"),
        "large_files": first(r"read the config and tokenizer of qwen-coder-1\.5b"),
        "loaded": first(r"loaded in [\d.]+ s"),
        "load_s": float(re.search(r"loaded in ([\d.]+) s", loaded).group(1)) if loaded else None,
        "first_answer_line": first(r"^```"),
        "summary": summary,
        "total": lines[-1][0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the stamped lines and the phases here (JSON)")
    args = p.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        clone, home = Path(tmp) / "tokenrouter", Path(tmp) / "store"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        env = dict(os.environ, TOKENROUTER_HOME=str(home), PIP_NO_CACHE_DIR="1")
        env.pop("VIRTUAL_ENV", None)
        lines = run(readme_command(), clone, env)
        store_bytes = sum(f.stat().st_size for f in home.rglob("*") if f.is_file())
    result = {
        "commit": commit.stdout.strip(),
        "command": readme_command(),
        "phases_s": phases(lines),
        "store_gib": round(store_bytes / 2**30, 2),
        "lines": lines,
    }
    print(json.dumps(result["phases_s"], indent=1), f"store {result['store_gib']} GiB", sep="\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
