#!/usr/bin/env python
"""Routed serving benchmark: RStitch through this engine against the baselines of design.md.

Same two models, same prompts, same policy, same process, one system after another:

  routed       this engine: one worker per model, each stepping on its own; a hand-off parks the
               request with its KV kept and the peer catches up on the unseen suffix only.
  standard     standard serving: a continuous-batching engine per model; every hand-off goes
               back to the client and is re-sent as a new request with the whole sequence (the
               sender's KV is freed, the receiver re-prefills). `standard+pc` adds prefix caching.
  lockstep     the official implementations' style: one loop steps the small model's batch,
               then the large model's, so each waits for the other (KV is kept).

All four run the very same workers, kernels and policy code (tokenrouter's `mode` switch); only
the serving architecture differs. Greedy outputs are checked to be identical across systems.
A closed-loop client keeps C requests in flight. Each (system, C) gets a warm-up, then
--repeats measured runs on a fresh engine; the table shows medians. Output tokens/s counts
every generated token over the run's wall time; latency is per request, submission to end.

    python benchmarks/bench_routing.py                    # demo pair from the store, C = 1 4 16
    python benchmarks/bench_routing.py --quick            # tiny random pair, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import RStitch

SYSTEMS = {
    "routed": dict(mode="routed", prefix_caching=True),
    "standard": dict(mode="standard", prefix_caching=False),
    "standard+pc": dict(mode="standard", prefix_caching=True),
    "lockstep": dict(mode="lockstep", prefix_caching=True),
}

TASKS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is and when to use one.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "Implement binary search in Python and explain its complexity.",
    "What is the difference between a process and a thread?",
    "Write a JavaScript function that debounces another function.",
    "Explain recursion with a short example in Python.",
    "Write a bash one-liner that counts lines in all .py files.",
    "How does garbage collection work in Python?",
    "Write a Python class for a stack with push, pop and peek.",
    "Explain the CAP theorem in two paragraphs.",
    "Write a function that reverses a linked list.",
    "What does the `yield` keyword do in Python?",
    "Write a regular expression that matches an email address and explain it.",
    "Explain big-O notation to a beginner.",
    "Write a Python script that reads a CSV file and prints column averages.",
]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def model_paths(args) -> dict[str, str]:
    if args.quick:
        from tokenrouter.testing import build_tiny_model, build_tokenizer

        root = tempfile.mkdtemp(prefix="tokenrouter-bench-")
        tok = build_tokenizer()
        return {
            "small": str(build_tiny_model(f"{root}/small", "qwen2", tokenizer=tok, seed=1, logit_scale=3.0)),
            "large": str(build_tiny_model(f"{root}/large", "qwen2", tokenizer=tok, seed=2, logit_scale=3.0,
                                          num_hidden_layers=4, hidden_size=128)),
        }
    if args.small and args.large:
        return {"small": args.small, "large": args.large}
    from tokenrouter.store import ensure_model

    return {"small": str(ensure_model("qwen-coder-0.5b")), "large": str(ensure_model("qwen-coder-1.5b"))}


async def run_level(args, paths, system: str, concurrency: int, prompts, warm_prompt, max_tokens: int):
    """One measured run on a fresh engine (its prefix cache holds nothing of earlier runs)."""
    cfg = SYSTEMS[system]
    specs = {
        name: ModelSpec(path=path, kv_cache_tokens=args.kv_cache_tokens, enable_prefix_caching=cfg["prefix_caching"])
        for name, path in paths.items()
    }
    policy = RStitch(tau=args.tau, small="small", large="large")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    threads = args.threads_lockstep if cfg["mode"] == "lockstep" else args.threads
    async with Engine(models=specs, policy=policy, mode=cfg["mode"], num_threads=threads) as engine:
        await engine.generate(warm_prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        limit = anyio.Semaphore(concurrency)
        outs = [None] * len(prompts)

        async def one(i):
            async with limit:
                outs[i] = await engine.generate(prompts[i], params)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        wall = time.perf_counter() - t0
        stats = engine.stats()
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs if o.finish_reason != "length"]
    n = sum(len(o.token_ids) for o in outs)
    lat = [o.latency for o in outs]
    return dict(
        wall_s=wall,
        tokens=n,
        tok_per_s=n / wall,
        p50_s=percentile(lat, 0.5),
        p99_s=percentile(lat, 0.99),
        ttft_p50_s=percentile([o.time_to_first_token for o in outs], 0.5),
        large_share=sum(o.token_models.count("large") for o in outs) / n,
        handoffs=sum(o.num_handoffs for o in outs),
        tokens_processed={m: sum(o.tokens_processed.get(m, 0) for o in outs) for m in paths},
        steps={m: s.steps for m, s in stats.items()},
        outputs=[o.token_ids for o in outs],
    )


async def main(args) -> None:
    paths = model_paths(args)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths["small"])
    tasks = TASKS * (1 + max(args.concurrency) * args.requests_per_slot // len(TASKS))
    results: dict = {"command": shlex.join([sys.executable, *sys.argv]), "args": vars(args), "models": paths, "runs": {}}
    print(f"# {results['command']}")
    print(f"models: {paths}; torch threads per worker: {args.threads} (lockstep: {args.threads_lockstep}); tau={args.tau}")
    reference: dict[int, list] = {}
    def encode(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)

    warm_prompt = encode("Hello! Who are you?")
    for c in args.concurrency:
        n_req = max(args.min_requests, c * args.requests_per_slot)
        prompts = [encode(t) for t in tasks[:n_req]]
        for system in args.systems:
            runs = [await run_level(args, paths, system, c, prompts, warm_prompt, args.max_tokens) for _ in range(args.repeats)]
            outputs = runs[0].pop("outputs")
            for r in runs[1:]:
                r.pop("outputs")
            same = reference.setdefault(c, outputs) == outputs
            med = {k: statistics.median(r[k] for r in runs) for k in ("tok_per_s", "p50_s", "p99_s", "ttft_p50_s", "wall_s")}
            med.update(large_share=runs[0]["large_share"], handoffs=runs[0]["handoffs"],
                       tokens_processed=runs[0]["tokens_processed"], same_tokens_as_routed=same, requests=n_req)
            results["runs"].setdefault(str(c), {})[system] = dict(median=med, repeats=runs)
            print(f"C={c:<3} {system:<12} {med['tok_per_s']:7.2f} tok/s  p50 {med['p50_s']:7.2f}s  p99 {med['p99_s']:7.2f}s"
                  f"  large {100 * med['large_share']:.0f}%  hand-offs {med['handoffs']}  processed {med['tokens_processed']}"
                  f"  same-as-routed {same}", flush=True)
    print()
    print("| C | system | output tok/s | x standard | x lockstep | p50 latency (s) | p99 latency (s) | tokens processed (small/large) |")
    print("|---|---|---|---|---|---|---|---|")
    for c, systems in results["runs"].items():
        base = {k: v["median"]["tok_per_s"] for k, v in systems.items()}
        for system, r in systems.items():
            m = r["median"]
            xs = f"{m['tok_per_s'] / base['standard']:.2f}" if "standard" in base else "-"
            xl = f"{m['tok_per_s'] / base['lockstep']:.2f}" if "lockstep" in base else "-"
            tp = m["tokens_processed"]
            print(f"| {c} | {system} | {m['tok_per_s']:.2f} | {xs} | {xl} | {m['p50_s']:.2f} | {m['p99_s']:.2f} | {tp['small']}/{tp['large']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small")
    p.add_argument("--large")
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--requests-per-slot", type=int, default=1, help="requests per level = max(min, C * this)")
    p.add_argument("--min-requests", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker thread (routed, standard: two workers step at once)")
    p.add_argument("--threads-lockstep", type=int, default=2, help="torch threads of lockstep's one stepping thread")
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="tiny random pair (tau 0.2), for a smoke test")
    a = p.parse_args()
    if a.quick:
        a.tau = 0.2 if a.tau == 0.03 else a.tau
    torch.set_num_threads(1)  # the main thread runs no torch op; workers set their own threads
    anyio.run(main, a)
