#!/usr/bin/env python
"""llama-cpp-python's rounds for bench_cpu_anchor.py, in a Python of its own.

bench_cpu_anchor.py runs llama.cpp in its own process by default; `--llama-python PYTHON` runs it
here instead, under another interpreter: a llama-cpp-python built for one CPU level (the AVX2 build
in ../shared/wheels/llama-avx2/, installed in a venv of its own) beside the engine pinned to that
level. Reads {"gguf", "requests" (token ids), "max_tokens", "threads"} as JSON on stdin and writes
llama_round's result, plus llama.cpp's own account of its build (its system info), as JSON on
stdout. Needs only llama_cpp.
"""

from __future__ import annotations

import json
import sys
import time


def llama_round(llm, requests: list[list[int]], max_tokens: int) -> dict:
    """One request after another, greedy, exactly max_tokens each: output tok/s and latencies."""
    latencies, t0 = [], time.perf_counter()
    for ids in requests:
        t = time.perf_counter()
        n = 0
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            n += 1
            if n == max_tokens:
                break
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    return {"tok_per_s": len(requests) * max_tokens / wall, "wall_s": wall, "latencies_s": latencies}


def model_round(Llama, gguf: str, requests: list[list[int]], max_tokens: int, threads: int) -> dict:
    llm = Llama(model_path=gguf, n_threads=threads, n_ctx=2048, verbose=False, seed=0)
    llama_round(llm, requests[:1], 8)  # warm-up
    return llama_round(llm, requests, max_tokens)


def main() -> None:
    import llama_cpp

    job = json.load(sys.stdin)
    out = model_round(llama_cpp.Llama, job["gguf"], job["requests"], job["max_tokens"], job["threads"])
    out["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    out["llama_cpp"] = llama_cpp.__version__
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
