#!/usr/bin/env python
"""Every way of naming the demo pair's large model, against `Engine()`'s own: what each computes
in, and its decode speed, side by side.

The forms: `Engine(policy=Single("large"))` (the store's default large model, as `Engine()`
serves it), its store name, its store directory, the store's `.gguf` path, `ModelSpec(path=...)`
on the directory and on the `.gguf`, and a copy of the GGUF outside the store (a user's own file)
named by its path and by its directory. All are loaded at once; each round runs every form once
(interleaved, so a drift of the machine hits one repeat of each): the chat prompt of README's
main job, --max-tokens greedy tokens, one request at a time. The table shows the median tok/s
over --repeats rounds, and each form's ratio to `Engine()`'s.

    python benchmarks/engine/bench_model_forms.py --json benchmarks/results/model-forms/forms.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams, Single, store
from tokenrouter.bench import machine_info

THREADS = 2
PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]


def forms(own_copy: Path) -> dict:
    name = store.DEFAULT_MODELS["large"]
    directory = store.ensure_model(name)
    gguf = store.gguf_for(directory)
    return {
        "Engine()": None,
        "store name": name,
        "store directory": str(directory),
        "store .gguf path": str(gguf),
        "ModelSpec(path=directory)": ModelSpec(path=directory),
        "ModelSpec(path=.gguf)": ModelSpec(path=gguf),
        "own .gguf path": str(own_copy),
        "own .gguf's directory": str(own_copy.parent),
    }


async def measure(args, own_copy: Path) -> dict:
    engines, loaded = {}, {}
    results: dict = {}
    try:
        for what, form in forms(own_copy).items():
            t0 = time.perf_counter()
            models = {} if form is None else {"models": {"large": form}}
            engine = Engine(policy=Single("large"), num_threads=THREADS, **models)
            await engine.start()
            engines[what] = engine
            m = engine.info().models["large"]
            loaded[what] = {"load_s": time.perf_counter() - t0, "precision": m.precision, "kernels": m.linear_kernel}
            print(
                f"{what}: loaded in {loaded[what]['load_s']:.1f} s: {m.precision}; {m.linear_kernel}", file=sys.stderr
            )
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
        for engine in engines.values():  # warm-up
            await engine.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0))
        runs: dict = {what: [] for what in engines}
        for r in range(args.repeats):
            for what, engine in engines.items():
                t0 = time.perf_counter()
                out = await engine.generate(PROMPT, params)
                runs[what].append(len(out.token_ids) / (time.perf_counter() - t0))
            print(f"round {r + 1}: " + ", ".join(f"{w} {v[-1]:.1f}" for w, v in runs.items()), file=sys.stderr)
    finally:
        for engine in engines.values():
            await engine.close()
    base = statistics.median(runs["Engine()"])
    for what in engines:
        tok_s = statistics.median(runs[what])
        results[what] = {**loaded[what], "tok_per_s": runs[what], "median_tok_per_s": tok_s, "ratio": tok_s / base}
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the raw results here")
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        own = Path(tmp) / "mine" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        own.parent.mkdir()
        shutil.copy(store.gguf_for(store.ensure_model(store.DEFAULT_MODELS["large"])), own)
        results = anyio.run(measure, args, own)
    print(f"\n| form | precision, kernels | load s | tok/s (median of {args.repeats}) | vs Engine() |")
    print("|---|---|---:|---:|---:|")
    for what, r in results.items():
        print(
            f"| {what} | {r['precision'].split(' (')[0]}, {r['kernels']} | {r['load_s']:.1f} "
            f"| {r['median_tok_per_s']:.1f} | {r['ratio']:.2f}x |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"machine": machine_info(), "args": vars(args) | {"json": str(args.json)}, "results": results}
        args.json.write_text(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
