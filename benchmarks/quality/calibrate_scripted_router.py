#!/usr/bin/env python
"""Calibrate ScriptedRouter on the demo pair: the regime RStitch(tau=0.03) routes in on real weights.

On random weights RStitch's entropy decisions are arbitrary, so the GPU kit's routed figures
(`bench_gpu.py --random-weights`) route ScriptedRouter instead, set to the large-model share and
hand-off rate measured here. Three runs, each the 16 coding questions of bench_routing.py
(through the chat template, greedy, exactly --max-tokens tokens, EOS ignored):

  rstitch-real    RStitch(tau) on the demo pair from the store (Qwen2.5-Coder-0.5B/1.5B, Q4_K_M),
                  one request at a time: with all 16 in flight a few entropies near tau fell
                  either side from run to run (3 of 16 requests differed between two runs, by
                  one token each), as steps mix catch-ups and decodes differently
  scripted-real   ScriptedRouter(share, rate) with the values just measured, on the same pair, all
                  16 in flight (it reads no logits: batching cannot change who writes)
  scripted-random the same ScriptedRouter on a random-weight pair (tiny shapes, the demo pair's
                  tokenizer, so the same prompt tokens): its writers must equal scripted-real's

Large share: tokens the large model wrote over all tokens. Hand-off rate: hand-offs per generated
token, a hand-off being a move of the request to the other model (`RequestOutput.num_handoffs`,
the bench's `handoffs`; the entry counts when the large model writes the first token, as the
request enters on the small model). Under RStitch not every move changes the writer: the large
model hands back after a sure token, and where the small model is unsure of the next it discards
it and hands straight back (a "bounce", two moves). The JSON counts writer changes and bounces too.

    python benchmarks/quality/calibrate_scripted_router.py --json benchmarks/results/scripted-router/calibration.json

A few minutes on two cores. ScriptedRouter.demo_pair() holds the committed run's values.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.engine.bench_routing import TASKS
from tokenrouter import Engine, ModelSpec, SamplingParams, store
from tokenrouter.bench import machine_info, release_memory
from tokenrouter.policies import RStitch, ScriptedRouter
from tokenrouter.policies.scripted import DEMO_HANDOFF_RATE, DEMO_LARGE_SHARE

MODELS = {"small": "qwen-coder-0.5b", "large": "qwen-coder-1.5b"}
RANDOM_LAYERS = {"small": 2, "large": 4}  # the random pair: tiny Qwen2 shapes (the script reads no logits)


async def run(name: str, paths: dict[str, str], policy, args, one_at_a_time: bool = False) -> dict:
    """The questions through one engine, all at once or one at a time; per request, who wrote each token."""
    specs = {m: ModelSpec(path=paths[m], kv_cache_tokens=8192) for m in policy.models}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    messages = [[{"role": "user", "content": t}] for t in TASKS]
    async with Engine(models=specs, policy=policy, num_threads=args.threads) as engine:
        precision = {m: engine.info().models[m].precision for m in policy.models}
        if one_at_a_time:
            outs = [await engine.generate(m, params) for m in messages]
        else:
            outs = await engine.generate_batch(messages, params)
        steps = {m: s.steps for m, s in engine.stats().items()}
    release_memory()
    bad = [o.error for o in outs if o.finish_reason != "length"]
    if bad:
        raise SystemExit(f"{name}: {len(bad)} requests did not write {args.max_tokens} tokens: {bad[0]}")
    tokens = sum(len(o.token_ids) for o in outs)
    large = sum(o.token_models.count("large") for o in outs)
    handoffs = sum(o.num_handoffs for o in outs)
    changes = sum(writer_changes(o.token_models) for o in outs)
    processed = {m: sum(o.tokens_processed.get(m, 0) for o in outs) for m in policy.models}
    result = {
        "policy": repr(policy),
        "in_flight": 1 if one_at_a_time else len(messages),
        "models": paths,
        "precision": precision,
        "tokens": tokens,
        "tokens_by_model": {"small": tokens - large, "large": large},
        "handoffs": handoffs,
        "large_share": large / tokens,
        "handoff_rate": handoffs / tokens,
        "writer_changes": changes,
        "bounces": (handoffs - changes) // 2,
        "tokens_processed": processed,
        "steps": steps,
        "requests": [
            {
                "prompt_tokens": len(o.prompt_token_ids),
                "handoffs": o.num_handoffs,
                # one letter a token: s(mall) or L(arge)
                "writers": "".join("L" if m == "large" else "s" for m in o.token_models),
            }
            for o in outs
        ],
    }
    print(
        f"{name}: {policy!r}: large wrote {large}/{tokens} = {result['large_share']:.4f}, "
        f"{handoffs} hand-offs = {result['handoff_rate']:.4f} a token ({changes} writer changes, "
        f"{result['bounces']} bounces); tokens processed {processed}",
        flush=True,
    )
    return result


def writer_changes(models: list[str]) -> int:
    """Changes of writer, the entry model (small) counting as the writer before the first token."""
    return sum(a != b for a, b in zip(["small", *models], models))


def random_pair(root: Path, tokenizer_dir: str) -> dict[str, str]:
    """Random weights in tiny shapes, with the demo pair's tokenizer (the same prompt tokens)."""
    from transformers import AutoTokenizer

    from tokenrouter.testing import build_tiny_model

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return {
        name: str(build_tiny_model(root / name, "qwen2", seed=i, tokenizer=tok, num_hidden_layers=layers))
        for i, (name, layers) in enumerate(RANDOM_LAYERS.items())
    }


async def main(args) -> None:
    real = {m: str(store.ensure_model(name)) for m, name in MODELS.items()}
    runs = {"rstitch-real": await run("rstitch-real", real, RStitch(tau=args.tau), args, one_at_a_time=True)}
    share, rate = runs["rstitch-real"]["large_share"], runs["rstitch-real"]["handoff_rate"]
    scripted = ScriptedRouter(share, rate, seed=args.seed)
    runs["scripted-real"] = await run("scripted-real", real, scripted, args)
    with tempfile.TemporaryDirectory(prefix="scripted-router-") as tmp:
        runs["scripted-random"] = await run("scripted-random", random_pair(Path(tmp), real["small"]), scripted, args)
        tokenizer = f"{MODELS['small']}'s tokenizer"
        runs["scripted-random"]["models"] = {
            m: f"random weights, tiny Qwen2 ({n} layers), {tokenizer}" for m, n in RANDOM_LAYERS.items()
        }
    pairs = zip(runs["scripted-real"]["requests"], runs["scripted-random"]["requests"])
    same = [a["writers"] == b["writers"] for a, b in pairs]
    print(f"scripted writers equal on the real and the random pair: {sum(same)}/{len(same)} requests")
    if (share, rate) != (DEMO_LARGE_SHARE, DEMO_HANDOFF_RATE):
        print(
            f"note: ScriptedRouter.demo_pair() holds ({DEMO_LARGE_SHARE}, {DEMO_HANDOFF_RATE}); "
            f"this run measured ({share}, {rate})"
        )
    out = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "store_models": {m: store.MODELS[name].description for m, name in MODELS.items()},
        "settings": {
            "prompts": "benchmarks/engine/bench_routing.py TASKS (16), chat template",
            "max_tokens": args.max_tokens,
            "greedy": True,
            "ignore_eos": True,
            "threads_per_worker": args.threads,
            "tau": args.tau,
            "seed": args.seed,
        },
        "definitions": {
            "large_share": "tokens written by the large model / all generated tokens",
            "handoff_rate": "RequestOutput.num_handoffs (moves of a request to the other model, as the "
            "bench's handoffs) / all generated tokens",
            "writer_changes": "changes of writer between consecutive tokens, the small model (where a "
            "request enters) counting as the writer before the first",
            "bounces": "(handoffs - writer_changes) / 2: moves to the small model and straight back, its "
            "token discarded, so no writer changed",
            "steps": "each worker's steps in the run (in_flight requests at a time)",
        },
        "calibrated": {"large_share": share, "handoff_rate": rate},
        "scripted_writers_equal_real_vs_random": sum(same) == len(same),
        "runs": runs,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens every request writes (the GPU kit's 64)")
    p.add_argument("--seed", type=int, default=0, help="ScriptedRouter's seed")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    p.add_argument("--json", help="write the runs here")
    a = p.parse_args()
    torch.set_num_threads(1)  # the main thread runs no torch op; each worker has --threads
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    anyio.run(main, a)
