#!/usr/bin/env python
"""Single-model serving benchmark: tokenrouter vs Hugging Face generate vs transformers' continuous batching.

All three systems run the SAME model weights on the SAME chat-formatted prompts (token ids built once,
deterministically from --seed), greedily, each producing exactly --max-tokens tokens per request
(EOS is ignored everywhere), in the same process, one after the other:

  engine        tokenrouter.Engine; a closed-loop client keeps at most C requests in flight
                (a semaphore over all prompts; a new request starts as soon as one finishes).
  hf_generate_onednn  the same with the engine's oneDNN linear layers swapped into the model
                (CPU, float32): like against like, the engine's kernels in both.
  hf_generate   `model.generate` on static, left-padded batches of C prompts, run one batch after
                another. A batch's wall time is the latency of every request in it.
  hf_cb         transformers' continuous batching (the manager behind `model.generate_batch`),
                attn_implementation "sdpa" (transformers 5.24 dropped the "paged|" prefix for sdpa),
                with the same KV budget in tokens, the same step token budget and the same
                closed-loop client as the engine. `--hf-cb-api generate_batch` instead submits all
                prompts at once through `model.generate_batch` with max_requests_per_batch=C
                (then the latency includes queueing, so it is not comparable with the others).

Each measured run goes over all prompts and follows a short warm-up (--warmup-prompts requests of
--warmup-tokens tokens, on prompts of their own). The engine and hf_cb get a fresh instance (and so an
empty KV cache) for every measured run: the engine's prefix cache would otherwise serve the prompts
of earlier runs and skip their prefill. Runs are interleaved (for each concurrency and repeat, every
system once), so a burst of load from other processes hits one repeat of each system rather than all
repeats of one. The table shows the median over --repeats runs of:

  tok/s             all generated tokens / wall time of the run
  p50/p99 latency   per request, from submission to its last token, as the client sees it
  vs static         tok/s relative to hf_generate at the same concurrency (and to hf_generate_onednn:
                    the same kernels)
  engine overhead   1 - time_forward_s / time_step_s: the worker's step time outside the model
                    forward (worker stats deltas over the measured run)
  CPU cores         CPU time / wall time of this process, and of every other process on the
                    machine (from /proc/stat). "others" > 0 means the numbers are distorted.
                    "this process" well under --threads for a compute-bound run means idle cores:
                    with torch's GNU OpenMP, a worker thread whose OpenMP team coexists with another
                    live thread's team (e.g. the event loop thread that allocated the KV cache)
                    stops spinning between ops (libgomp throttles when its threads outnumber the
                    CPUs), which shows up here as ~1.6 of 2 cores.

Usage:
    python benchmarks/anchors/bench_single.py                          # default run (~15 min on 2 cores)
    python benchmarks/anchors/bench_single.py --quick                  # ~2 min smoke run
    python benchmarks/anchors/bench_single.py --concurrency 1 16 --json out.json
    python benchmarks/anchors/bench_single.py --model /path/to/model.gguf      # slow: a GGUF loads in ~25 s per run
    python benchmarks/anchors/bench_single.py --profile /tmp/prof              # py-spy the first engine run per C

This file is the command line; beside it, a module for each part: single_workload.py (the prompts and output
lengths), single_runs.py (the interleaved runs), engine_runs.py and hf_baselines.py (the systems),
token_agreement.py (the token check), single_report.py (the table and the JSON), py_spy_profile.py.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.anchors.single_report import load_warning, medians, print_table, write_json
from benchmarks.anchors.single_runs import SYSTEMS, run_interleaved
from benchmarks.anchors.single_workload import make_workload
from benchmarks.anchors.token_agreement import token_checks
from benchmarks.bench_log import log
from tokenrouter import ModelSpec
from tokenrouter.engine import load_tokenizer

# The main thread stays at one torch thread and runs no multi-threaded op: with GNU OpenMP, a second
# live OpenMP team makes libgomp stop spinning and slows every op ~25%. Each system steps in a thread
# of its own that sets NUM_THREADS itself (the engine's workers; single_runs.in_fresh_thread for the HF ones).
torch.set_num_threads(1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with --quick and the default dtype applied."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, default=None, help="HF model dir or .gguf file (default: store 'smollm2')")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    # Defaults sized to ~15 min on 2 cores: batch-1 decode of this 135M model runs ~13 tok/s (memory bound),
    # so the concurrency-1 runs (3 systems x 3 repeats x N x T tokens) dominate the wall time.
    p.add_argument("--num-prompts", type=int, default=None, help="prompts per run (default: max(8, 2 x C))")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--output-lengths",
        choices=["mixed", "fixed"],
        default="mixed",
        help="mixed: each request wants a length drawn from [max/4, max] (as EOS makes them differ in real use); "
        "fixed: every request wants --max-tokens",
    )
    p.add_argument("--min-prompt-tokens", type=int, default=20)
    p.add_argument("--max-prompt-tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-prompts", type=int, default=4, help="warm-up requests (their own prompts) per run")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens per warm-up request")
    p.add_argument("--kv-cache-tokens", type=int, default=16384, help="KV budget (tokens) for engine and hf_cb")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="step token budget, engine and hf_cb")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests per step, engine and hf_cb")
    p.add_argument("--hf-cb-page-size", type=int, default=256, help="hf_cb page size (its default is 256)")
    p.add_argument("--hf-cb-api", choices=["closed", "generate_batch"], default="closed")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--quick", action="store_true", help="~2 min smoke run: 16 prompts <= 64 tokens, 16 new, 1 repeat")
    p.add_argument("--profile", type=Path, default=None, help="dir: py-spy the first measured engine run per C")
    p.add_argument("--json", type=Path, default=None, help="write all raw numbers here")
    p.add_argument("--device", default="cpu", help="torch device of every system's model (e.g. cuda:0)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="every system's compute dtype (default: float32 on CPU, bfloat16 on CUDA)",
    )
    p.add_argument(
        "--prefill-backend",
        choices=["auto", "fa2", "fa3"],
        default="auto",
        help="on CUDA with flashinfer: its prefill kernels (ModelSpec.prefill_backend)",
    )
    p.add_argument(
        "--cuda-graph-max-batch",
        type=int,
        default=None,
        help="on CUDA: the engine's decode steps up to this size replay CUDA graphs (default: ModelSpec's)",
    )
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if torch.device(args.device).type == "cpu" else "bfloat16"
    if args.quick:
        args.num_prompts, args.max_tokens, args.repeats, args.warmup_prompts = 16, 16, 1, 2
        args.max_prompt_tokens = min(args.max_prompt_tokens, 64)
    if min(args.concurrency) < 1 or args.repeats < 1 or (args.num_prompts is not None and args.num_prompts < 1):
        p.error("concurrency, repeats and num-prompts must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    t_start = time.perf_counter()

    import transformers

    model_path = args.model
    if model_path is None:
        from tokenrouter.store import ensure_model

        model_path = ensure_model("smollm2")
    model_path = Path(model_path)
    log(
        f"model {model_path}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    work = make_workload(args, load_tokenizer(ModelSpec(path=model_path)))
    if "hf_generate_onednn" in args.systems and (torch.device(args.device).type != "cpu" or args.dtype != "float32"):
        args.systems = [s for s in args.systems if s != "hf_generate_onednn"]
        log("hf_generate_onednn skipped: the oneDNN layers are for float32 on CPU")

    runs = run_interleaved(args, model_path, work)
    checks, warnings = token_checks(runs, work)
    summary = medians(runs)
    print_table(args, model_path, work, summary, checks)
    warning = load_warning(runs)
    warnings += [warning] if warning else []
    for w in warnings:
        print(w)
    total = time.perf_counter() - t_start
    print(f"wall time: {total:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in runs.timings.items()) + ")")
    if args.json:
        write_json(args, model_path, work, runs, summary, checks, warnings, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
