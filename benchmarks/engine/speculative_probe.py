#!/usr/bin/env python
"""Greedy Speculative(k) at C = 1 on the first 8 bench_routing TASKS (48 tokens each, demo pair):
the drafts each request had accepted beside what teacher-forced agreement says they must be
(speculative_agreement.py's results), and where each worker's time went (engine.stats()
deltas: forward, whole steps, idle). k = 0 runs the large model alone.

    python benchmarks/engine/speculative_probe.py 2
    python benchmarks/engine/speculative_probe.py 3 --int8     # the small model in int8 (ModelSpec quantization)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import Single, Speculative

FIELDS = ("steps", "tokens_processed", "time_forward_s", "time_step_s", "time_idle_s", "time_waiting_for_cores_s")
AGREEMENT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "speculative", "agreement.jsonl")


async def main(k: int, int8: bool) -> None:
    predicted = [json.loads(line) for line in open(AGREEMENT)][:8]
    models = None  # the demo pair
    if int8:
        models = {
            "small": ModelSpec(path="qwen-coder-0.5b", quantization="int8"),
            "large": ModelSpec(path="qwen-coder-1.5b"),
        }
    async with Engine(models=models, policy=Speculative(k=k) if k else Single("large")) as e:
        await e.generate([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        before, t0, small = e.stats(), time.perf_counter(), 0
        for i, task in enumerate(TASKS[:8]):
            params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
            out = await e.generate([{"role": "user", "content": task}], params)
            small += out.token_models.count("small")
            if k:
                want = predicted[i][f"k{k}"]["accepted"] if f"k{k}" in predicted[i] else None
                print(
                    f"task {i}: accepted {out.token_models.count('small')}, teacher-forced {want}, "
                    f"hand-offs {out.num_handoffs}"
                )
        wall = time.perf_counter() - t0
        after = e.stats()
    print(f"k={k}: {8 * 48 / wall:.2f} tok/s, wall {wall:.1f} s, small wrote {small}")
    for model in after:
        delta = {f: round(getattr(after[model], f) - getattr(before[model], f), 2) for f in FIELDS}
        per_step = delta["time_forward_s"] / max(1, delta["steps"])
        print(model, delta, f"forward per step {per_step:.3f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("k", type=int, nargs="?", default=2, help="draft length; 0: the large model alone")
    ap.add_argument("--int8", action="store_true", help="the small model's linear layers in int8")
    args = ap.parse_args()
    anyio.run(main, args.k, args.int8)
