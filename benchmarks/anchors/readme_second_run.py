#!/usr/bin/env python
"""README's second-run figure: the quick start's command again, with the pair (and its built
kernels) already in the store: `bash scripts/setup.sh`, then `tokenrouter generate` on the
README's question; seconds to set-up done, to the first answer byte on stdout, and in all, and
the engine's "loaded in" line. Run from the repository root, twice or more (the first run after
a reboot also reads the store from disk).

    python benchmarks/anchors/readme_second_run.py --runs 2 --out benchmarks/results/readme/second-run.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

QUESTION = "Write a Python function that checks whether a number is prime."


def one_run() -> dict:
    t0 = time.time()
    setup = subprocess.run(["bash", "scripts/setup.sh"], capture_output=True, text=True)
    t_setup = time.time() - t0
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [".venv/bin/tokenrouter", "generate", QUESTION], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.read(1)
    t_first = time.time() - t0
    proc.stdout.read()
    err = proc.stderr.read().decode()
    proc.wait()
    loaded = [line.strip() for line in err.splitlines() if "loaded in" in line]
    return {
        "setup_s": round(t_setup, 1),
        "first_token_s": round(t_first, 1),
        "total_s": round(time.time() - t0, 1),
        "loaded": loaded[-1] if loaded else None,
        "returncodes": [setup.returncode, proc.returncode],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(one_run())
        print(runs[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "question": QUESTION, "runs": runs}, indent=1)
    )


if __name__ == "__main__":
    main()
