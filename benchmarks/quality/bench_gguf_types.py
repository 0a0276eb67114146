#!/usr/bin/env python
"""A GGUF of every llama.cpp file type, computed by the engine and by llama-cpp-python: do they
write the same tokens?

The demo 0.5B (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M) is requantized by llama.cpp's own quantizer
into each file type (`tokenrouter.testing.gguf.requantize`; a requantized file holds the weights
quantized twice: a test file, not a model to ship). Each file is loaded by the engine (what it
computes in, which tensors its block kernels take) and by `llama_cpp.Llama`; both write
--max-tokens greedy tokens (EOS ignored) for each of the coding prompts, from the same token ids.
Reported per type: the tokens both wrote alike before the first difference, the share of
positions that agree, and each side's tok/s (one request at a time, 2 threads).

Both compute as llama.cpp does (activations rounded to int8 per block, integer dot products), but
not in the same order, so a near-tie can go either way; from the first difference on, each
continues its own text.

    pip install 'tokenrouter[anchor]'
    python benchmarks/quality/bench_gguf_types.py --json benchmarks/results/gguf-types/types.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.anchors.bench_cpu_anchor import in_own_thread
from tokenrouter import Engine, SamplingParams, Single, store
from tokenrouter.api import chat_ids
from tokenrouter.bench import machine_info
from tokenrouter.config import ModelSpec
from tokenrouter.engine import load_tokenizer, tensor_places
from tokenrouter.testing.gguf import LLAMA_FTYPES, requantize

THREADS = 2
QUESTIONS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek, raising on an empty pop.",
]


def llama_tokens(path: Path, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_threads=THREADS, n_ctx=2048, verbose=False, seed=0)
    outs, tokens, t0 = [], 0, time.perf_counter()
    for ids in prompts:
        got = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            got.append(int(tok))
            if len(got) == n:
                break
        outs.append(got)
        tokens += len(got)
    return outs, tokens / (time.perf_counter() - t0)


async def engine_tokens(path: Path, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float, dict]:
    async with Engine(models={"m": str(path)}, policy=Single("m"), num_threads=THREADS) as e:
        m = e.info().models["m"]
        await e.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        outs, tokens, t0 = [], 0, time.perf_counter()
        for ids in prompts:
            out = await e.generate(ids, params)
            outs.append(list(out.token_ids))
            tokens += len(out.token_ids)
        return outs, tokens / (time.perf_counter() - t0), {"precision": m.precision, "kernels": m.linear_kernel}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    prefix = []
    same = total = 0
    for x, y in zip(a, b):
        first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        prefix.append(first)
        same += sum(p == q for p, q in zip(x, y))
        total += min(len(x), len(y))
    return {"same_prefix": prefix, "positions_agreeing": same / max(1, total)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--types", nargs="+", default=["Q4_K_M (store)", *LLAMA_FTYPES])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/tokenrouter-gguf-types"))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    source = store.gguf_for(store.ensure_model(store.DEFAULT_MODELS["small"]))
    tokenizer = load_tokenizer(ModelSpec(path=source))
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    results = {}
    for ftype in args.types:
        path = (
            source if ftype.startswith("Q4_K_M (store)") else requantize(source, ftype, args.workdir / f"{ftype}.gguf")
        )
        types = Counter(t.kind for name, t in tensor_places(path).items() if len(t.shape) == 2)
        mine, mine_tps, loaded = anyio.run(engine_tokens, path, prompts, args.max_tokens)
        theirs, theirs_tps = in_own_thread(lambda: llama_tokens(path, prompts, args.max_tokens))
        results[ftype] = {
            "tensor_types": dict(types),
            **loaded,
            **agreement(mine, theirs),
            "engine_tok_per_s": mine_tps,
            "llama_cpp_tok_per_s": theirs_tps,
            "engine_tokens": mine,
            "llama_cpp_tokens": theirs,
        }
        r = results[ftype]
        print(
            f"{ftype}: {dict(types)}; {loaded['kernels']}; same prefix {r['same_prefix']}, "
            f"{r['positions_agreeing']:.0%} of positions; {mine_tps:.1f} vs {theirs_tps:.1f} tok/s",
            file=sys.stderr,
        )
    head = f"same prefix (of {args.max_tokens})"
    print(f"\n| file type | matrices | engine kernels | {head} | agreeing | tok/s engine / llama.cpp |")
    print("|---|---|---|---|---:|---:|")
    for ftype, r in results.items():
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["tensor_types"].items(), key=lambda kv: -kv[1]))
        prefix = ", ".join(map(str, r["same_prefix"]))
        print(
            f"| {ftype} | {kinds} | {r['kernels']} | {prefix} | {r['positions_agreeing']:.0%} "
            f"| {r['engine_tok_per_s']:.1f} / {r['llama_cpp_tok_per_s']:.1f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
        args.json.write_text(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
