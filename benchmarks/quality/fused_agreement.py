#!/usr/bin/env python
"""The fused forward's greedy tokens against transformers' forward on the store's models: each
model alone, three prompts, --tokens greedy tokens each (EOS ignored), once with the fused
forward and once in a fresh process with TOKENROUTER_FUSED_LAYERS=off; where each prompt's two
answers first differ (float32 near-ties can flip a token).

    python benchmarks/quality/fused_agreement.py --json benchmarks/results/step-breakdown/rows-in-c/agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = ("qwen-coder-0.5b", "qwen-coder-1.5b")
PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain recursion in one paragraph.",
    "def fibonacci(n):",
)


def answers(tokens: int) -> dict:
    """This process's answers: {model: {"forward": ..., "tokens": [[ids] per prompt]}}."""
    import anyio

    from tokenrouter import Engine, SamplingParams
    from tokenrouter.policies import Single

    async def run() -> dict:
        out = {}
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        for name in MODELS:
            async with Engine(models={"m": name}, policy=Single("m")) as e:
                got = [(await e.generate(p, params)).token_ids for p in PROMPTS]
                out[name] = {"forward": e.stats()["m"].model_forward, "tokens": got}
        return out

    return anyio.run(run)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--json")
    p.add_argument("--answers-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    if args.answers_only:
        print(json.dumps(answers(args.tokens)))
        return
    fused = answers(args.tokens)
    env = dict(os.environ, TOKENROUTER_FUSED_LAYERS="off")
    child = [sys.executable, __file__, "--answers-only", "--tokens", str(args.tokens)]
    plain = json.loads(subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout)
    from tokenrouter.bench import machine_info

    result = {"prompts": PROMPTS, "tokens": args.tokens, "fused": fused, "transformers": plain, "first_divergence": {}}
    for name in MODELS:
        pairs = zip(fused[name]["tokens"], plain[name]["tokens"])
        result["first_divergence"][name] = [first_divergence(a, b) for a, b in pairs]
        print(f"{name}: first divergence per prompt {result['first_divergence'][name]} ({fused[name]['forward']})")
    result["machine"] = machine_info()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
