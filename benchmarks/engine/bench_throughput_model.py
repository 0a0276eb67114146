"""Check the throughput model against measurement: predicted vs measured tokens/s at several
concurrency levels under delayed_batching="auto", and the B it picks against a sweep of fixed B.

    python benchmarks/engine/bench_throughput_model.py [--concurrency 1 4 16] [--sweep 1 2 4 8 16]
        [--repeats 2] [--warmup 20] [--seconds 45] [--max-tokens 32] [--tau 0.03] [--threads N]

Models: the demo pair from the store (`tokenrouter pull demo`), RStitch(tau). Each level runs a
closed loop: C clients, each sending held-out-style prompts (Python standard-library functions to
write) one after another, greedy. Tokens are counted as they stream in, over the measured
window, after the warm-up. The prediction is `engine.throughput_prediction(refresh=True)` at
the end of the window: the model is fed the routing and step times the engine observed.

That prediction is in-sample: it describes the very run it was fitted on. The error reported is
out of sample: at each level a second run, on other prompts (drawn with --holdout-seed) and a
fresh engine with B fixed to what the "auto" run picked, is measured, and the first run's
prediction is compared with it.

For the sweep, the same traffic runs at the largest C with B fixed for both models, --repeats
times, interleaved (median shown); the model's prediction for each B comes from the routing
observed in the "auto" run at that C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, RStitch, SamplingParams
from tokenrouter.autobatch.throughput_model import predict
from tokenrouter.bench import release_memory
from tokenrouter.training import python_corpus


async def closed_loop(engine, prompts, concurrency, warmup, seconds, max_tokens) -> float:
    """Output tokens per second over the window [warmup, warmup + seconds) with C clients."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    t0 = time.monotonic()
    start, end = t0 + warmup, t0 + warmup + seconds
    counted = 0

    async def client(i):
        nonlocal counted
        k = i
        while time.monotonic() < end:
            messages = [{"role": "user", "content": prompts[k % len(prompts)]["prompt"]}]
            k += concurrency
            async for delta in engine.stream(messages, params):
                now = time.monotonic()
                if start <= now < end:
                    counted += len(delta.token_ids)
                if now >= end:
                    break

    async with anyio.create_task_group() as tg:
        for i in range(concurrency):
            tg.start_soon(client, i)
    return counted / seconds


async def main(args) -> dict:
    prompts = python_corpus(200, seed=1)
    holdout = python_corpus(200, seed=args.holdout_seed)
    policy = RStitch(tau=args.tau)
    results: dict = {"auto": {}, "sweep": {}}
    observed = {}
    for c in args.concurrency:
        async with Engine(policy=policy, delayed_batching="auto", num_threads=args.threads) as engine:
            measured = await closed_loop(engine, prompts, c, args.warmup, args.seconds, args.max_tokens)
            pred = engine.throughput_prediction(refresh=True)
            observed[c] = pred
            results["auto"][c] = {
                "measured_tokens_per_s": measured,
                "predicted_tokens_per_s": pred.tokens_per_s,
                "error": None if not pred.tokens_per_s else pred.tokens_per_s / measured - 1,
                "batch_min": pred.batch_min,
                "model_concurrency": pred.concurrency,
                "routing": {m: vars(r) for m, r in pred.routing.items()},
                "latency": {m: vars(lat) for m, lat in pred.latency.items()},
                "shared_device": pred.shared_device,
                "turns": pred.turns,
                "note": pred.note,
            }
            print(
                f"C={c}: measured {measured:.2f} tok/s, predicted {pred.tokens_per_s} (B={pred.batch_min})", flush=True
            )
        release_memory()  # a real pair per engine: without it the heap grows until the box runs out
        if args.holdout_seed is not None and pred.tokens_per_s:
            async with Engine(policy=policy, delayed_batching=dict(pred.batch_min), num_threads=args.threads) as engine:
                other = await closed_loop(engine, holdout, c, args.warmup, args.seconds, args.max_tokens)
            release_memory()
            results["auto"][c].update(holdout_measured_tokens_per_s=other, holdout_error=pred.tokens_per_s / other - 1)
            print(
                f"C={c}: held-out run measured {other:.2f} tok/s: error out of sample "
                f"{pred.tokens_per_s / other - 1:+.0%}",
                flush=True,
            )
    c = max(args.concurrency)
    auto = observed[c]
    measured: dict[int, list[float]] = {b: [] for b in args.sweep}
    for rep in range(args.repeats):  # interleaved, so drift of the machine hits every B alike
        for b in args.sweep:
            batch = dict.fromkeys(policy.models, b)
            async with Engine(policy=policy, delayed_batching=batch, num_threads=args.threads) as engine:
                measured[b].append(await closed_loop(engine, prompts, c, args.warmup, args.seconds, args.max_tokens))
            release_memory()
            print(f"C={c}, B={b}, repeat {rep + 1}: measured {measured[b][-1]:.2f} tok/s", flush=True)
    for b in args.sweep:
        predicted = None
        if auto.tokens_per_s:
            predicted = predict(
                auto.latency,
                auto.routing,
                auto.concurrency,
                batch_min=dict.fromkeys(policy.models, b),
                batch_wait_s=auto.batch_wait_s,
                shared_device=auto.shared_device,
                turns=auto.turns,
            ).tokens_per_s
        results["sweep"][b] = {
            "measured_tokens_per_s": statistics.median(measured[b]),
            "measured_runs": measured[b],
            "predicted_tokens_per_s": predicted,
        }
        print(f"C={c}, B={b}: measured median {statistics.median(measured[b]):.2f} tok/s, predicted {predicted}")
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--sweep", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=2, help="measured runs per B in the sweep (median)")
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument(
        "--holdout-seed",
        type=int,
        default=2,
        help="prompts of the held-out run at each level (the error out of sample); -1: none",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker (default: the engine's, turns on the CPU's cores)",
    )
    p.add_argument("--out", default="bench_out/throughput_model.json")
    args = p.parse_args()
    args.holdout_seed = None if args.holdout_seed < 0 else args.holdout_seed
    torch.set_num_threads(1)
    out = anyio.run(main, args)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2, default=str)
    print(f"wrote {args.out}")
