#!/usr/bin/env python
"""`Engine(policy=...)` as a new user meets it (the store's demo pair, every ModelSpec default,
no thread count given, nothing set in the caller's thread), at one request in flight: output
tok/s on bench_routing's coding tasks, exactly --max-tokens tokens each (EOS ignored, greedy),
after a warm-up request.

One process, one system per run: it prints one JSON line. To compare two commits, run it from a
worktree of each in alternation (the same machine, interleaved), e.g.

    git worktree add /tmp/before <commit>
    for r in 1 2 3; do for tree in /tmp/before .; do
        (cd $tree && python benchmarks/anchors/bench_default_engine.py --system speculative-auto) >> runs.jsonl
    done; done
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS
from tokenrouter import Engine, ModelSpec, SamplingParams, store
from tokenrouter.bench import machine_info
from tokenrouter.policies import RStitch, Single, Speculative

SYSTEMS = {
    "large": lambda: Single("large"),
    "speculative-auto": lambda: Speculative(k="auto"),
    "speculative-4": lambda: Speculative(k=4),
    "rstitch": lambda: RStitch(tau=0.03),
}


async def run(system: str, requests: int, max_tokens: int, by_path: bool, draft_vocab: int | None) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    models = None
    if by_path:  # the store's files named by path, as a user with their own copy would
        models = {name: ModelSpec(path=str(store.ensure_model(m))) for name, m in store.DEFAULT_MODELS.items()}
    if draft_vocab is not None:  # the anchor's narrow drafter head (bench_cpu_anchor.py --draft-vocab)
        models = {name: ModelSpec(path=m) for name, m in store.DEFAULT_MODELS.items()}
        models["small"] = ModelSpec(path=store.DEFAULT_MODELS["small"], draft_vocab=draft_vocab)
    t_load = time.perf_counter()
    async with Engine(models=models, policy=SYSTEMS[system]()) as e:
        load_s = time.perf_counter() - t_load
        chat = lambda task: [{"role": "user", "content": task}]  # noqa: E731
        await e.chat(chat(TASKS[-1]), params)  # warm-up
        latencies = []
        before = e.stats()
        t0 = time.perf_counter()
        for task in TASKS[:requests]:
            t = time.perf_counter()
            await e.chat(chat(task), params)
            latencies.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        after = e.stats()
    # per model: steps, seconds in forwards, and seconds of its steps outside the forward
    # (scheduling, sampling, verifying, routing: the engine's own Python)
    workers = {
        m: {
            "steps": after[m].steps - before[m].steps,
            "forward_s": after[m].time_forward_s - before[m].time_forward_s,
            "outside_forward_s": (after[m].time_step_s - before[m].time_step_s)
            - (after[m].time_forward_s - before[m].time_forward_s),
        }
        for m in after
    }
    return {
        "system": system,
        "models": "by path" if by_path else "Engine() defaults",
        "tok_per_s": requests * max_tokens / wall,
        "latency_p50_s": statistics.median(latencies),
        "load_s": load_s,
        "workers": workers,
        "draft_vocab": draft_vocab,
        "requests": requests,
        "max_tokens": max_tokens,
        "machine": machine_info(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=sorted(SYSTEMS), default="speculative-auto")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--by-path", action="store_true", help="ModelSpec(path=...) of the store's files, not Engine()'s")
    p.add_argument("--draft-vocab", type=int, help="the small model's head on its first N ids (ModelSpec.draft_vocab)")
    args = p.parse_args()
    print(json.dumps(anyio.run(run, args.system, args.requests, args.max_tokens, args.by_path, args.draft_vocab)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
