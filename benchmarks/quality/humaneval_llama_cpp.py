#!/usr/bin/env python
"""HumanEval answered by llama-cpp-python on a store model's GGUF, as `tokenrouter eval` asks the
engine: the same prompt tokens (tokenrouter.eval.prompt), greedy, at most 512 new tokens, cut at
the closing fence or the end of turn, each program tested in the same sandbox with the same
limits. llama.cpp computes the checkpoint's own arithmetic (x rounded to int8 per block), so its
pass@1 tells the checkpoint's quality in that arithmetic apart from the engine's. One problem at
a time (how `llama_cpp.Llama` serves), 2 threads, in a thread that ends with the run
(bench_cpu_anchor.in_own_thread says why).

    python benchmarks/quality/humaneval_llama_cpp.py --model qwen-coder-0.5b \
        --out benchmarks/results/humaneval-llama-cpp/qwen-coder-0.5b.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.anchors.bench_cpu_anchor import THREADS, in_own_thread
from tokenrouter import ModelSpec, store
from tokenrouter.bench import machine_info
from tokenrouter.engine import load_tokenizer
from tokenrouter.eval import EvalSettings, Limits, load_problems, run_program
from tokenrouter.eval.prompt import PROMPT_VERSION, STOP, build_program, prompt_ids


def answer(llm, tokenizer, ids: list[int], max_tokens: int, end: set[int]) -> tuple[str, int, str]:
    """(text, tokens, finish reason) of one greedy answer, cut before the first stop string."""
    out: list[int] = []
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        if token in end:
            return tokenizer.decode(out, skip_special_tokens=True), len(out), "stop"
        out.append(token)
        text = tokenizer.decode(out, skip_special_tokens=True)
        cut = min((text.index(s) for s in STOP if s in text), default=None)
        if cut is not None:
            return text[:cut], len(out), "stop"
        if len(out) == max_tokens:
            return text, len(out), "length"
    return tokenizer.decode(out, skip_special_tokens=True), len(out), "stop"


def main(args) -> None:
    from llama_cpp import Llama

    settings = EvalSettings()
    limits = Limits(timeout_s=settings.timeout_s, memory_bytes=settings.memory_mb << 20)
    path = store.ensure_model(args.model)
    tokenizer = load_tokenizer(ModelSpec(path=str(path)))
    end = {tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])} - {None}
    problems = load_problems()[: args.limit]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def run() -> int:
        llm = Llama(model_path=str(store.gguf_for(path)), n_threads=THREADS, n_ctx=2048, verbose=False, seed=0)
        passed = 0
        with out.open("w") as f:
            head = {"type": "run", "model": args.model, "gguf": store.gguf_for(path).name, "llama_cpp": True}
            head |= {"prompt_version": PROMPT_VERSION, "max_tokens": settings.max_tokens, "machine": machine_info()}
            f.write(json.dumps(head) + "\n")
            for i, problem in enumerate(problems):
                t = time.perf_counter()
                text, n, reason = answer(llm, tokenizer, prompt_ids(tokenizer, problem), settings.max_tokens, end)
                latency = time.perf_counter() - t
                outcome = run_program(build_program(problem, text).code, limits)
                passed += outcome.passed
                record = {"type": "problem", "task_id": problem.task_id, "passed": outcome.passed}
                record |= {"status": outcome.status, "completion": text, "output_tokens": n, "finish_reason": reason}
                f.write(json.dumps(record | {"latency_s": round(latency, 3)}) + "\n")
                f.flush()
                print(f"{problem.task_id}: {outcome.status}, {n} tokens; {i + 1}/{len(problems)}, {passed} passed")
        return passed

    passed = in_own_thread(run)
    print(f"llama.cpp on {args.model}: {passed}/{len(problems)} passed")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen-coder-0.5b", help="a store model with a GGUF beside it")
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=None, help="the first N problems only")
    main(p.parse_args())
