#!/usr/bin/env python
"""Does the engine step on every core whatever thread count its caller set? (issue 21)

One greedy chat answer, run the ways a user runs it, each in a fresh process, interleaved over
--repeats rounds; the table shows medians of the answer's seconds (load excluded) and of the
whole command's wall time:

  cli single            `tokenrouter generate ... --policy single --model large=qwen-coder-1.5b`
                        (the CLI pins its own thread to one torch thread)
  cli single --threads  the same with `--threads <cores>`
  script single         `Engine(models={"large": ...}, policy=Single("large"))` from a plain script
  script single pinned  the same after `torch.set_num_threads(1)` in the caller's thread
  cli routed            the default `tokenrouter generate` (RStitch on the demo pair)
  cli routed --threads  the same with `--threads <cores>`

`--tree DIR` runs a checkout's package instead of the installed one. With `--baseline-tree DIR`
(a checkout of an earlier commit, e.g. `git worktree add`), the
`cli` rows run once more from that tree's package, side by side, marked `(baseline)`.

    python benchmarks/kernels/bench_threads.py --out benchmarks/results/threads/threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Write a Python function that checks whether a number is prime."

SCRIPT = """
import json, sys, time, anyio, torch
from tokenrouter import Engine, SamplingParams, Single
from tokenrouter import store
if sys.argv[1] == "pinned":
    torch.set_num_threads(1)
async def main():
    engine = Engine(models={"large": store.model_dir("qwen-coder-1.5b")}, policy=Single("large"))
    t0 = time.perf_counter()
    async with engine:
        load = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = await engine.generate([{"role": "user", "content": sys.argv[2]}],
                                    SamplingParams(temperature=0, max_tokens=int(sys.argv[3])))
        seconds = time.perf_counter() - t1
        threads = engine.stats()["large"].steps_by_threads
    print(json.dumps({"summary": {"tokens": len(out.token_ids), "seconds": seconds, "load_seconds": load,
                                  "steps_by_threads": threads}}))
anyio.run(main)
"""


def configs(cores: int, single_tokens: int, routed_tokens: int, tree: Path | None, baseline: Path | None) -> list[dict]:
    cli = [sys.executable, "-m", "tokenrouter", "generate", PROMPT, "--json", "--no-pull"]
    single = ["--policy", "single", "--model", "large=qwen-coder-1.5b", "--max-tokens", str(single_tokens)]
    routed = ["--max-tokens", str(routed_tokens)]
    threads = ["--threads", str(cores)]
    out = [
        {"name": "cli single", "cmd": cli + single},
        {"name": f"cli single --threads {cores}", "cmd": cli + single + threads},
        {"name": "script single", "cmd": [sys.executable, "-c", SCRIPT, "plain", PROMPT, str(single_tokens)]},
        {"name": "script single pinned", "cmd": [sys.executable, "-c", SCRIPT, "pinned", PROMPT, str(single_tokens)]},
        {"name": "cli routed", "cmd": cli + routed},
        {"name": f"cli routed --threads {cores}", "cmd": cli + routed + threads},
    ]
    if tree is not None:
        for c in out:
            c["pythonpath"] = str(tree)
    if baseline is not None:
        for c in [c for c in out if c["name"].startswith("cli")]:
            out.append({"name": c["name"] + " (baseline)", "cmd": c["cmd"], "pythonpath": str(baseline)})
    return out


def run_one(config: dict) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if "pythonpath" in config:
        env["PYTHONPATH"] = config["pythonpath"]
    t0 = time.perf_counter()
    # outside the checkout: the working directory would come first on sys.path
    proc = subprocess.run(config["cmd"], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{config['name']} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    s = record["summary"]
    return {
        "wall_s": round(wall, 3),
        "seconds": s["seconds"],
        "load_s": s.get("load_seconds"),
        "tokens": s["tokens"],
        "tokens_per_model": s.get("tokens_per_model"),
        "handoffs": s.get("handoffs"),
        "steps_by_threads": s.get("steps_by_threads"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--single-tokens", type=int, default=48)
    p.add_argument("--routed-tokens", type=int, default=64)
    p.add_argument("--tree", type=Path, default=None, help="the checkout to run (default: the installed package)")
    p.add_argument("--baseline-tree", type=Path, default=None, help="an earlier checkout to run the cli rows from")
    p.add_argument("--only", nargs="*", default=None, help="run only the configurations with these names")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from tokenrouter.engine import usable_cores

    cores = usable_cores()
    todo = configs(cores, args.single_tokens, args.routed_tokens, args.tree, args.baseline_tree)
    if args.only:
        todo = [c for c in todo if c["name"] in args.only]
    runs: dict[str, list[dict]] = {c["name"]: [] for c in todo}
    for r in range(args.repeats):  # interleaved: each round runs every configuration once
        for c in todo:
            res = run_one(c)
            runs[c["name"]].append(res)
            print(
                f"round {r + 1} {c['name']:<34} {res['seconds']:7.2f} s answer, {res['wall_s']:7.2f} s wall, "
                f"{res['tokens']} tokens",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for c in todo:
        rs = runs[c["name"]]
        rows.append(
            {
                "name": c["name"],
                "cmd": c["cmd"][1:] if c["cmd"][1] == "-m" else ["-c", "<SCRIPT>", *c["cmd"][3:]],
                "median_seconds": statistics.median(x["seconds"] for x in rs),
                "median_wall_s": statistics.median(x["wall_s"] for x in rs),
                "runs": rs,
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "cores": cores,
        "repeats": args.repeats,
        "prompt": PROMPT,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "models": "Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M GGUF dequantized to float32",
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| how | answer s (median) | whole command s (median) |\n|---|---|---|")
    for row in rows:
        print(f"| {row['name']} | {row['median_seconds']:.1f} | {row['median_wall_s']:.1f} |")


if __name__ == "__main__":
    main()
