#!/usr/bin/env python
"""Greedy agreement between precisions on the demo pair: does the engine in bf16, or on the GGUF's
own 4-bit weights, write the tokens the float32 engine writes?

Every precision answers the same coding questions (bench_routing's, through the chat template,
greedy, exactly --max-tokens tokens, EOS ignored) with each model alone and with RStitch(0.03).
Against float32's answer to the same request it reports the length of the common prefix (the
first divergence; after it the texts go their own ways, so later tokens say nothing) and whether
the answers are equal. One engine at a time, all requests at once.

    python benchmarks/quality/precision_agreement.py --json benchmarks/results/precision-agreement/agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS
from tokenrouter import Engine, ModelSpec, SamplingParams, store
from tokenrouter.bench import machine_info, release_memory
from tokenrouter.policies import RStitch, Single

MODELS = {"small": "qwen-coder-0.5b", "large": "qwen-coder-1.5b"}
PRECISIONS = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "gguf": {"quantization": "gguf"},
    "gguf+bf16": {"quantization": "gguf+bf16"},
}
SYSTEMS = {"small": lambda: Single("small"), "large": lambda: Single("large"), "rstitch": lambda: RStitch(tau=0.03)}


async def answers(precision: str, system: str, questions: list[str], max_tokens: int) -> tuple[list, dict]:
    policy = SYSTEMS[system]()
    specs = {
        m: ModelSpec(path=store.ensure_model(MODELS[m]), kv_cache_tokens=8192, **PRECISIONS[precision])
        for m in policy.models
    }
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    async with Engine(models=specs, policy=policy, num_threads=2) as engine:
        loaded = {m: engine.info().models[m].precision for m in policy.models}
        outs = [None] * len(questions)

        async def one(i):
            outs[i] = await engine.generate([{"role": "user", "content": questions[i]}], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(questions)):
                tg.start_soon(one, i)
    return [list(o.token_ids) for o in outs], loaded


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(args) -> None:
    questions = TASKS[: args.questions]
    record = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info(),
        "max_tokens": args.max_tokens,
    }
    got, loaded = {}, {}
    for system in args.systems:
        for precision in ["float32", *[p for p in args.precisions if p != "float32"]]:
            got[(system, precision)], loaded[(system, precision)] = anyio.run(
                answers, precision, system, questions, args.max_tokens
            )
            release_memory()
            print(f"{system} {precision}: {loaded[(system, precision)]}", flush=True)
    rows = []
    for (system, precision), ids in got.items():
        if precision == "float32":
            continue
        ref = got[(system, "float32")]
        prefixes = [common_prefix(a, b) for a, b in zip(ids, ref, strict=True)]
        rows.append(
            {
                "system": system,
                "precision": precision,
                "equal": sum(p == args.max_tokens for p in prefixes),
                "answers": len(prefixes),
                "common_prefix_median": statistics.median(prefixes),
                "common_prefix": prefixes,
                "loaded": loaded[(system, precision)],
            }
        )
    lines = [
        "| system | precision | answers equal to float32's | median tokens before the first difference |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        prefix = f"{r['common_prefix_median']:g} of {args.max_tokens}"
        lines.append(f"| {r['system']} | {r['precision']} | {r['equal']}/{r['answers']} | {prefix} |")
    print("\n".join(lines))
    if args.json:
        record.update(rows=rows, answers={f"{s}/{p}": v for (s, p), v in got.items()}, table="\n".join(lines) + "\n")
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precisions", nargs="+", default=["bfloat16", "gguf", "gguf+bf16"], choices=list(PRECISIONS))
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    main(a)
