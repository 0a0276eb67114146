#!/usr/bin/env python
"""Routed serving benchmark: RStitch through this engine against the baselines of `tokenrouter bench`.

A thin wrapper on `tokenrouter.bench` (the harness behind `tokenrouter bench`, which has the
generated short, long and agentic workloads): this script runs one workload, the coding
questions below as chat prompts, every request writing exactly --max-tokens tokens, through:

  routed       this engine: one worker per model, each stepping on its own; a hand-off parks the
               request with its KV kept and the peer catches up on the unseen suffix only.
  standard     standard serving: a continuous-batching engine per model; every hand-off goes
               back to the client and is re-sent as a new request with the whole sequence (the
               sender's KV is freed, the receiver re-prefills). `standard+pc` adds prefix caching.
  lockstep     the official implementations' style: one loop steps the small model's batch,
               then the large model's, so each waits for the other (KV is kept).
  small, large each model alone through this engine (policy Single), on the same requests: what
               routing saves against serving the large model only, and what it costs against
               the small one.

All run the very same workers, kernels and policy code (tokenrouter's `mode` switch); only the
serving architecture differs. Greedy outputs are checked to be identical across the routing
systems.
A closed-loop client keeps C requests in flight out of max(8, C) (or --requests). Each
(system, C) gets --repeats measured runs, each on a fresh engine after a warm-up request; the
table shows medians. Output tokens/s counts every generated token over the run's wall time;
latency is per request, submission to end, as the client sees it.

    python benchmarks/engine/bench_routing.py                    # demo pair from the store, C = 1 4 16
    python benchmarks/engine/bench_routing.py --quick            # tiny random pair, seconds
    python benchmarks/engine/bench_routing.py --systems routed lockstep standard+pc large --reuse-engines
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

from tokenrouter.bench import SYSTEMS, BenchConfig, Session, Sizes, WorkloadSpec, markdown, run_bench
from tokenrouter.bench.report import write_json
from tokenrouter.policies import RStitch, ScriptedRouter

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


def tasks_workload(max_tokens: int) -> WorkloadSpec:
    """TASKS as one-turn chat sessions, each writing exactly `max_tokens` tokens."""
    return WorkloadSpec(
        "tasks",
        Sizes(max_tokens),
        source="bench_routing.TASKS",
        prompts=tuple(Session([{"role": "user", "content": t}], [max_tokens]) for t in TASKS),
    )


def model_paths(args) -> dict[str, str]:
    if args.quick:
        from tokenrouter.testing import build_tiny_model, build_tokenizer

        root = tempfile.mkdtemp(prefix="tokenrouter-bench-")
        tok = build_tokenizer()
        return {
            "small": str(build_tiny_model(f"{root}/small", "qwen2", tokenizer=tok, seed=1, logit_scale=3.0)),
            "large": str(
                build_tiny_model(
                    f"{root}/large",
                    "qwen2",
                    tokenizer=tok,
                    seed=2,
                    logit_scale=3.0,
                    num_hidden_layers=4,
                    hidden_size=128,
                )
            ),
        }
    if args.small and args.large:
        return {"small": args.small, "large": args.large}
    from tokenrouter.store import ensure_model

    return {"small": str(ensure_model("qwen-coder-0.5b")), "large": str(ensure_model("qwen-coder-1.5b"))}


def main(args) -> None:
    from tokenrouter.config import ModelSpec
    from tokenrouter.engine import load_tokenizer

    paths = model_paths(args)
    cfg = BenchConfig(
        models=paths,
        policy=ScriptedRouter.demo_pair() if args.router == "scripted" else RStitch(tau=args.tau),
        workloads=[tasks_workload(args.max_tokens)],
        systems=args.systems,
        concurrency=args.concurrency,
        repeats=args.repeats,
        requests=args.requests,
        kv_cache_tokens=args.kv_cache_tokens,
        threads=args.threads,
        threads_lockstep=args.threads_lockstep,
        max_run_s=args.max_run_s,
        device=args.device,
        dtype=args.dtype,
        cuda_graph_max_batch=args.cuda_graph_max_batch,
        reuse_engines=args.reuse_engines,
        order=args.order,
        # flashinfer's prefill kernels (ModelSpec.prefill_backend): "fa2" where FA3 did not build
        model_options={m: {"prefill_backend": args.prefill_backend} for m in paths}
        if args.prefill_backend != "auto"
        else {},
    )
    command = shlex.join([sys.executable, *sys.argv])
    print(f"# {command}")
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    # --json is rewritten after every run, so a run killed midway leaves what it finished
    checkpoint = (lambda partial: write_json(partial, args.json)) if args.json else None
    result = anyio.run(lambda: run_bench(cfg, tokenizer, command=command, progress=print, checkpoint=checkpoint))
    print()
    print(markdown(result), end="")
    for w in result.warnings:
        print(f"warning: {w}")
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small")
    p.add_argument("--large")
    p.add_argument("--tau", type=float, default=0.03)
    p.add_argument(
        "--router",
        choices=["rstitch", "scripted"],
        default="rstitch",
        help="scripted: ScriptedRouter.demo_pair(), the demo pair's measured RStitch regime whatever the weights "
        "(for random weights, where entropy routing is arbitrary); --tau is then unused",
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--max-tokens", type=int, default=24, help="tokens every request writes (EOS ignored)")
    p.add_argument("--requests", type=int, default=None, help="requests per level (default max(8, C))")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker (routed, standard; default: turns on the CPU, each step on every core)",
    )
    p.add_argument(
        "--threads-lockstep",
        type=int,
        default=None,
        help="torch threads of lockstep's one stepping thread (default: every core)",
    )
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument("--max-run-s", type=float, default=None, help="cap each run's wall time (the table marks it)")
    p.add_argument(
        "--reuse-engines",
        action="store_true",
        help="load each system's engine once for all its runs (prefix cache reset before each run)",
    )
    p.add_argument(
        "--order",
        choices=["rounds", "levels"],
        default="rounds",
        help="levels: every system at one level before the next (with --reuse-engines all stay loaded)",
    )
    p.add_argument("--json", help="every run, the medians and the machine, rewritten after each run")
    p.add_argument("--quick", action="store_true", help="tiny random pair (tau 0.2), for a smoke test")
    p.add_argument("--device", default="cpu", help="torch device of both models (e.g. cuda:0: one GPU, a stream each)")
    p.add_argument("--dtype", default="auto", help="compute dtype (auto: float32 on CPU, the checkpoint's on GPU)")
    p.add_argument(
        "--cuda-graph-max-batch",
        type=int,
        default=None,
        help="on CUDA: decode steps up to this size replay CUDA graphs (0: off; default: ModelSpec's)",
    )
    p.add_argument(
        "--prefill-backend",
        choices=["auto", "fa2", "fa3"],
        default="auto",
        help="on CUDA with flashinfer: its prefill kernels (ModelSpec.prefill_backend)",
    )
    a = p.parse_args()
    if a.quick:
        a.tau = 0.2 if a.tau == 0.03 else a.tau
    torch.set_num_threads(1)  # the main thread runs no torch op; workers set their own threads
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    main(a)
