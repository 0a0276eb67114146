#!/usr/bin/env python
"""What `tokenrouter.openai` costs: the same streamed chat through an `openai` client answered in
process, and through `Engine.stream`, side by side on the demo pair.

`Engine()` (the demo pair under RStitch(0.03)) serves both. Each round runs the request once each
way (interleaved, the order alternating), greedy, --max-tokens tokens with EOS ignored, so both
write the very same tokens. Time to first token: from the call to the first piece of text;
tok/s: tokens over the whole call. Medians over --rounds rounds, after a warm-up of each.
`--small DIR --large DIR` serves another pair under the same policy.

    python benchmarks/engine/bench_openai_overhead.py --json benchmarks/results/openai-overhead/overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, SamplingParams
from tokenrouter.bench import machine_info
from tokenrouter.openai import async_client
from tokenrouter.policies import RStitch

MESSAGES = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]


async def through_engine(engine, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    t0, first, tokens = time.perf_counter(), None, []
    async for delta in engine.stream(MESSAGES, params):
        if first is None and delta.text:
            first = time.perf_counter() - t0
        tokens += delta.token_ids
    wall = time.perf_counter() - t0
    return {"ttft_s": first, "tok_per_s": len(tokens) / wall, "tokens": tokens}


async def through_client(client, max_tokens: int) -> dict:
    t0, first, text = time.perf_counter(), None, []
    stream = await client.chat.completions.create(
        model="large",
        messages=MESSAGES,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    wall = time.perf_counter() - t0
    return {"ttft_s": first, "tok_per_s": usage.completion_tokens / wall, "text": "".join(text)}


async def measure(args) -> dict:
    pair = {"small": args.small, "large": args.large} if args.small and args.large else None
    async with Engine(pair, RStitch(tau=0.03), num_threads=2) as engine:
        client = async_client(engine)
        await through_engine(engine, 8)
        await through_client(client, 8)
        runs: dict = {"engine": [], "client": []}
        for r in range(args.rounds):
            order = ("engine", "client") if r % 2 == 0 else ("client", "engine")
            for way in order:
                got = await (
                    through_engine(engine, args.max_tokens)
                    if way == "engine"
                    else through_client(client, args.max_tokens)
                )
                runs[way].append(got)
            print(
                f"round {r + 1}: engine {runs['engine'][-1]['tok_per_s']:.1f} tok/s, ttft "
                f"{runs['engine'][-1]['ttft_s']:.3f} s; client {runs['client'][-1]['tok_per_s']:.1f} tok/s, ttft "
                f"{runs['client'][-1]['ttft_s']:.3f} s",
                file=sys.stderr,
            )
        same = (
            engine.info().tokenizer.decode(runs["engine"][0]["tokens"], skip_special_tokens=True)
            == runs["client"][0]["text"]
        )
    summary = {
        way: {
            "median_ttft_s": statistics.median(r["ttft_s"] for r in rs),
            "median_tok_per_s": statistics.median(r["tok_per_s"] for r in rs),
        }
        for way, rs in runs.items()
    }
    summary["ratio"] = {
        "ttft": summary["client"]["median_ttft_s"] / summary["engine"]["median_ttft_s"],
        "tok_per_s": summary["client"]["median_tok_per_s"] / summary["engine"]["median_tok_per_s"],
    }
    for rs in runs.values():
        for r in rs:
            r.pop("tokens", None)
            r.pop("text", None)
    return {"summary": summary, "same_text": same, "runs": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path)
    p.add_argument("--small", help="with --large: this pair's directories (default: Engine()'s, the demo pair)")
    p.add_argument("--large")
    args = p.parse_args()
    torch.set_num_threads(2)
    result = anyio.run(measure, args)
    s = result["summary"]
    print("\n| way | time to first token (s) | tok/s |\n|---|---:|---:|")
    for way in ("engine", "client"):
        print(f"| {way} | {s[way]['median_ttft_s']:.3f} | {s[way]['median_tok_per_s']:.1f} |")
    ratio = s["ratio"]
    print(f"client / engine: ttft {ratio['ttft']:.3f}x, tok/s {ratio['tok_per_s']:.3f}x; same: {result['same_text']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"machine": machine_info(), "args": vars(args) | {"json": str(args.json)}, **result}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
