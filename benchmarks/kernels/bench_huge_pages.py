#!/usr/bin/env python
"""Weights in huge pages against the allocator's own pages (engine/native/huge_pages.py), side by
side, interleaved, medians.

  kernel   the block kernel at one row over --copies repacked copies of a layer (together past the
           CPU's caches, as a model's layers are), each copy allocated both ways in this process;
           each round times both, in alternating order
  model    a store model's decode, one fresh process per run (TOKENROUTER_HUGE_PAGES=off for the
           other pages), alternating: after a warm-up answer, --tokens greedy tokens of one
           request (EOS ignored); tok/s of that answer (its prompt comes from the prefix cache)

    python benchmarks/kernels/bench_huge_pages.py --json benchmarks/results/huge-pages/huge-pages.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from tokenrouter.bench import machine_info
from tokenrouter.engine.native import huge_pages
from tokenrouter.engine.quant import gguf_native, probe

SHAPES = [("Q4_K", (8960, 1536)), ("Q6_K", (1536, 8960))]
VARIANTS = ("huge", "plain")
PROMPT = "Write a Python function that checks whether a number is prime, with tests."


def packed_copies(lib, kind: str, shape: tuple[int, int], copies: int, huge: bool) -> list[torch.Tensor]:
    before = os.environ.pop(huge_pages.ENV, None)
    if not huge:
        os.environ[huge_pages.ENV] = "off"
    try:
        gen = torch.Generator().manual_seed(0)
        return [gguf_native.repack(lib, kind, probe.random_blocks(kind, shape, gen), shape) for _ in range(copies)]
    finally:
        os.environ.pop(huge_pages.ENV, None)
        if before is not None:
            os.environ[huge_pages.ENV] = before


def kernel_rounds(copies: int, rounds: int) -> list[dict]:
    lib, why = gguf_native.load()
    if lib is None:
        raise SystemExit(f"no GGUF block kernels here: {why}")
    out = []
    for kind, shape in SHAPES:
        weights = {v: packed_copies(lib, kind, shape, copies, v == "huge") for v in VARIANTS}
        x = torch.randn(1, shape[1])
        per_call = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                t = time.perf_counter()
                for w in weights[v]:
                    gguf_native.matmul(lib, kind, w, shape, x, packed=True)
                per_call[v].append((time.perf_counter() - t) / copies)
        size = weights["huge"][0].numel()
        row = {"kind": kind, "shape": list(shape), "bytes": size}
        for v in VARIANTS:
            us = statistics.median(per_call[v]) * 1e6
            row[v] = {"us": us, "gb_per_s": size / us / 1e3, "rounds_us": [s * 1e6 for s in per_call[v]]}
        row["plain_over_huge"] = row["plain"]["us"] / row["huge"]["us"]
        print(
            f"{kind} {shape[0]}x{shape[1]}: huge {row['huge']['us']:.0f} us ({row['huge']['gb_per_s']:.1f} GB/s), "
            f"plain {row['plain']['us']:.0f} us ({row['plain']['gb_per_s']:.1f} GB/s)",
            flush=True,
        )
        out.append(row)
        del weights
    return out


def child(model: str, tokens: int, threads: int) -> None:
    """One decode measurement of `model`, printed as JSON (run in its own process)."""
    import anyio

    from tokenrouter import Engine, SamplingParams
    from tokenrouter.policies import Single

    torch.set_num_threads(threads)

    async def main():
        async with Engine(models={"large": model}, policy=Single("large"), num_threads=threads) as e:
            await e.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
            t = time.perf_counter()
            out = await e.generate(PROMPT, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
            return len(out.token_ids) / (time.perf_counter() - t)

    print(json.dumps({"tok_per_s": anyio.run(main)}), flush=True)


def model_rounds(model: str, tokens: int, rounds: int, threads: int) -> dict:
    runs = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            env = {k: val for k, val in os.environ.items() if k != huge_pages.ENV}
            if v == "plain":
                env[huge_pages.ENV] = "off"
            cmd = [sys.executable, __file__, "--child", model, "--tokens", str(tokens), "--threads", str(threads)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[v].append(json.loads(done.stdout.strip().splitlines()[-1])["tok_per_s"])
            print(f"round {r + 1} {v}: {runs[v][-1]:.2f} tok/s", flush=True)
    med = {v: statistics.median(runs[v]) for v in VARIANTS}
    ratio = med["huge"] / med["plain"]
    print(f"{model}: huge {med['huge']:.2f} tok/s, plain {med['plain']:.2f}: {ratio:.3f}x", flush=True)
    return {"model": model, "tokens": tokens, "runs": runs, "medians": med, "huge_over_plain": ratio}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15, help="kernel rounds")
    p.add_argument("--model", default="qwen-coder-1.5b", help="a store model ('' skips the model part)")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--model-rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--json")
    a = p.parse_args()
    if a.child:
        return child(a.child, a.tokens, a.threads)
    torch.set_num_threads(a.threads)
    result = {
        "command": "python benchmarks/kernels/"
        + " ".join(shlex.quote(x) for x in [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "threads": a.threads,
        "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
        else None,
        "kernel": kernel_rounds(a.copies, a.rounds),
    }
    if a.model:
        result["model"] = model_rounds(a.model, a.tokens, a.model_rounds, a.threads)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
