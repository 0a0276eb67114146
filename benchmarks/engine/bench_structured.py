#!/usr/bin/env python
"""What structured output costs: the grammar's mask per step, and what it does to requests in the
same batch that have no constraint.

One model (default: the demo pair's small model, Qwen2.5-Coder-0.5B, whose 151,936-token
vocabulary both demo models share), greedy, every request writing --max-tokens tokens:

  free      2C unconstrained requests at once
  mixed     C unconstrained requests and C constrained to a JSON schema, at once

Same batch size in both, and every request writes --max-tokens tokens (the schema asks for at
least 50 records), so the difference is the masking: the unconstrained requests' latency
and the whole step's time. Repeats are interleaved (free, mixed, free, mixed, ...) after a
warm-up of each, and each number is the median. It also times, off the engine, the compile of
the schema (first, then cached) and the vocabulary's tokenizer info, which an engine builds once
on its first constrained request.

    python benchmarks/engine/bench_structured.py --json benchmarks/results/structured/structured.json
    python benchmarks/engine/bench_structured.py --quick     # a tiny random model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.bench import machine_info

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,40}$"},
        "language": {"enum": ["python", "rust", "go", "c"]},
        "lines": {"type": "integer", "minimum": 1, "maximum": 9999},
        "tested": {"type": "boolean"},
    },
    "required": ["name", "language", "lines", "tested"],
}
# At least 50 records: no constrained answer can end before --max-tokens, so both systems keep
# every request to the end and their batches match step for step.
SCHEMA = {
    "type": "object",
    "properties": {"projects": {"type": "array", "items": RECORD, "minItems": 50}},
    "required": ["projects"],
}
PROMPTS = [
    "List fifty small Python projects as JSON.",
    "Describe a command-line tool written in Rust, as JSON.",
    "Give a JSON record for a web server in Go.",
    "A JSON summary of a C library for parsing dates.",
]


def _model(args) -> str:
    if args.quick:
        import tempfile

        from tokenrouter.testing import build_tiny_model

        return str(build_tiny_model(tempfile.mkdtemp(prefix="tokenrouter-bench-") + "/m", "qwen2"))
    from tokenrouter import store

    return str(store.ensure_model(args.model))


async def _round(engine: Engine, c: int, mixed: bool, max_tokens: int) -> dict:
    free = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=max_tokens, response_format=SCHEMA)
    work = [(PROMPTS[i % len(PROMPTS)], free) for i in range(c)]
    work += [(PROMPTS[i % len(PROMPTS)], constrained if mixed else free) for i in range(c)]
    before = engine.stats()[engine.info().entry_model]
    latencies: list[float | None] = [None] * len(work)
    tokens = [0] * len(work)
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        prompt, params = work[i]
        out = await engine.generate([{"role": "user", "content": prompt}], params)
        latencies[i], tokens[i] = out.latency, len(out.token_ids)

    async with anyio.create_task_group() as tg:
        for i in range(len(work)):
            tg.start_soon(one, i)
    wall = time.perf_counter() - t0
    after = engine.stats()[engine.info().entry_model]
    steps = after.steps - before.steps
    return {
        "wall_s": wall,
        "steps": steps,
        "step_s": (after.time_step_s - before.time_step_s) / max(1, steps),
        "forward_s": (after.time_forward_s - before.time_forward_s) / max(1, steps),
        "unconstrained_latency_s": statistics.median(latencies[:c]),
        "unconstrained_tokens": sum(tokens[:c]),
        "other_tokens": sum(tokens[c:]),
    }


def _compile_times(engine: Engine) -> dict:
    """The tokenizer info (once per engine) and the schema's compile, first and cached, off the engine."""
    from tokenrouter.config import JsonSchema
    from tokenrouter.structured import GrammarCompiler

    info = engine.info()
    loaded = info.models[info.entry_model]
    compiler = GrammarCompiler(loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids)
    t0 = time.perf_counter()
    compiler.compile(JsonSchema(json_schema={"type": "object"}))  # builds the tokenizer info first
    info_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(JsonSchema(json_schema=SCHEMA))
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(JsonSchema(json_schema=SCHEMA))
    cached_s = time.perf_counter() - t0
    return {
        "tokenizer_info_and_trivial_compile_s": info_s,
        "schema_first_compile_s": first_s,
        "schema_cached_s": cached_s,
    }


async def main(args) -> dict:
    torch.set_num_threads(args.threads)
    path = _model(args)
    spec = ModelSpec(path=path, kv_cache_tokens=8192)
    rounds: dict[str, list[dict]] = {"free": [], "mixed": []}
    load_before = os.getloadavg()[0]
    async with Engine(models={"m": spec}, num_threads=args.threads) as engine:
        for mixed in (False, True):  # warm-up: kernels, the grammar compiler
            await _round(engine, 1, mixed, 8)
        for r in range(args.repeats):
            for name in ("free", "mixed"):
                rounds[name].append(await _round(engine, args.concurrency, name == "mixed", args.max_tokens))
                await engine.reset_prefix_cache()
                print(f"round {r + 1} {name}: {json.dumps(rounds[name][-1])}", file=sys.stderr, flush=True)
        compile_times = _compile_times(engine)
        vocab = engine.info().models["m"].vocab_size
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rounds.items()}
    return {
        "model": path,
        "vocab_size": vocab,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "schema": SCHEMA,
        "rounds": rounds,
        "median": med,
        "mixed_over_free": {
            k: med["mixed"][k] / med["free"][k] for k in ("step_s", "forward_s", "unconstrained_latency_s")
        },
        "compile": compile_times,
        "machine": machine_info(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen-coder-0.5b", help="a store name (default: the demo pair's small model)")
    p.add_argument("--concurrency", type=int, default=8, help="C: C unconstrained requests beside C others")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a tiny random model, one repeat")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.concurrency, args.max_tokens = 1, 2, 8
    result = anyio.run(main, args)
    m = result["mixed_over_free"]
    print(
        f"mixed / free: step {m['step_s']:.3f}x, forward {m['forward_s']:.3f}x, "
        f"unconstrained latency {m['unconstrained_latency_s']:.3f}x; compile {json.dumps(result['compile'])}"
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
