"""How much each routing policy sends to the large model, and how often it agrees with it.

    python benchmarks/quality/router_quality.py --labels runs/labels-demo --router R2R=runs/r2r-demo \\
        [--router CITER=DIR --router CoLLM=DIR] [--tau 0.03] [--generate 8 --max-tokens 64]

Two measurements, on the examples that `tokenrouter train-router` held out (same --heldout and
--seed):

- teacher-forced, over every held-out labelled token: each position sees the reference prefix.
  The policy decides who writes it. We report the share the large model writes, and how often
  the routed token (the writer's greedy token) equals the large model's own greedy token;
- generated (with --generate N): N held-out prompts served greedily by the engine under each
  policy, and by the large model alone. We report the share of tokens the large model wrote, and
  the share of the large model's own answer each routed answer reproduces before it first differs.

Prints a markdown table (and writes JSON with --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import CITER, R2R, CoLLM, RStitch, Single
from tokenrouter.training import Labels, python_corpus
from tokenrouter.training.router_training import split_examples, teacher_forced_eval

LEARNED = {"r2r": R2R, "citer": CITER, "collm": CoLLM}


def heldout_prompts(labels: Labels, heldout: float, seed: int, n: int) -> list[str]:
    """The prompts of the first n held-out examples (the labels must come from --python-corpus)."""
    match = re.fullmatch(r"python_corpus\((\d+), seed=(\d+)\)", labels.source)
    if match is None:
        raise SystemExit("--generate needs labels made with `tokenrouter label --python-corpus N`")
    corpus = python_corpus(int(match[1]), int(match[2]))
    _, held_rows = split_examples(labels, heldout, seed)
    examples = sorted(set(labels.example[held_rows].tolist()))[:n]
    return [corpus[i]["prompt"] for i in examples]


async def serve(policy, paths: dict[str, str], prompts: list[str], max_tokens: int, threads: int) -> list:
    specs = {name: ModelSpec(path=p, kv_cache_tokens=8192) for name, p in paths.items() if name in policy.models}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs: list = [None] * len(prompts)
    async with Engine(models=specs, policy=policy, num_threads=threads) as engine:

        async def one(i):
            outs[i] = await engine.generate([{"role": "user", "content": prompts[i]}], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return outs


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labels", required=True)
    p.add_argument(
        "--router", action="append", default=[], metavar="NAME=DIR", help="a trained router, shown as NAME; repeatable"
    )
    p.add_argument("--tau", type=float, default=0.03, help="RStitch's threshold to compare with")
    p.add_argument("--heldout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generate", type=int, default=0, metavar="N", help="also serve N held-out prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)

    labels = Labels.load(args.labels)
    systems = {
        "small alone": ("small", {}),
        "large alone": ("large", {}),
        f"RStitch(tau={args.tau})": ("rstitch", {"tau": args.tau}),
    }
    for entry in args.router:
        name, d = entry.split("=", 1)
        kind = json.loads((Path(d) / "router.json").read_text())["kind"]
        systems[name] = (kind, {"router": d})
    common = {"split": "heldout", "heldout": args.heldout, "seed": args.seed}
    results = {
        name: {"teacher_forced": teacher_forced_eval(labels, pol, **kw, **common)}
        for name, (pol, kw) in systems.items()
    }

    if args.generate:
        prompts = heldout_prompts(labels, args.heldout, args.seed, args.generate)
        paths = dict(zip(["small", "large"], labels.model_paths))
        policies = {
            "small alone": Single("small"),
            "large alone": Single("large"),
            f"RStitch(tau={args.tau})": RStitch(tau=args.tau),
            **{name: LEARNED[pol](kw["router"]) for name, (pol, kw) in systems.items() if pol in LEARNED},
        }
        reference = None
        for name in ["large alone", *[n for n in policies if n != "large alone"]]:
            t0 = time.perf_counter()
            outs = anyio.run(serve, policies[name], paths, prompts, args.max_tokens, args.threads)
            seconds = time.perf_counter() - t0
            if name == "large alone":
                reference = [o.token_ids for o in outs]
            tokens = sum(len(o.token_ids) for o in outs)
            large = sum(o.token_models.count("large") for o in outs)
            reproduced = sum(common_prefix(o.token_ids, r) for o, r in zip(outs, reference))
            results[name]["generated"] = {
                "prompts": len(prompts),
                "tokens": tokens,
                "large_share": large / max(tokens, 1),
                "reproduced": reproduced / max(sum(len(r) for r in reference), 1),
                "seconds": seconds,
            }
            print(f"served {name}: {tokens} tokens in {seconds:.0f} s", file=sys.stderr)

    n_tok = next(iter(results.values()))["teacher_forced"]["tokens"]
    print(
        f"\nHeld-out: {n_tok} labelled tokens"
        + (f"; {args.generate} prompts served, {args.max_tokens} tokens max" if args.generate else "")
    )
    head = "| policy | large-model share (teacher-forced) | agreement with the large model (teacher-forced) |"
    line = "|---|---|---|"
    if args.generate:
        head += " large-model share (served) | share of the large model's answer reproduced (served) |"
        line += "---|---|"
    print(head)
    print(line)
    for name, r in results.items():
        tf = r["teacher_forced"]
        row = f"| {name} | {100 * tf['large_share']:.1f}% | {100 * tf['agreement']:.2f}% |"
        if "generated" in r:
            g = r["generated"]
            row += f" {100 * g['large_share']:.1f}% | {100 * g['reproduced']:.1f}% |"
        print(row)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
