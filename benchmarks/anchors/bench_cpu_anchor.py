#!/usr/bin/env python
"""The CPU anchor: llama-cpp-python on the very GGUF files the store holds, side by side with the
engine's systems on the demo pair, in each precision, interleaved.

A user who wants a small model in a Python process on a CPU would pick llama-cpp-python, so every
engine figure here is read against it. Per round (the rounds interleave, so a drift of the
machine hits one repeat of each system):

  llama.cpp large / small   `llama_cpp.Llama` on the store's Q4_K_M GGUF of each model, in this
                            process, greedy, one request at a time (how its high-level object
                            serves): its tok/s is the same at every C, its latency grows with C
  engine, per precision     tokenrouter.bench over the systems below at each C, one run each:
                            large, small (each alone), rstitch (RStitch(0.03)), bild (BiLD(0.9/2)),
                            speculative-auto and speculative-4 (Speculative(k)). Precisions:
                            gguf (the GGUF's own 4-bit/int8 weights, bf16 compute), gguf+bf16
                            (those for steps of few rows, bf16 copies for more), bfloat16,
                            float32; `--all-systems-in` names those that run every system, the
                            others run the models alone (enough for the ratios that need them)

Every request is one of bench_routing's coding questions through the chat template, writing
exactly --max-tokens tokens (EOS ignored, greedy). Tables show medians over --repeats rounds.
`--simulate-no-bf16` sets TOKENROUTER_PROBE_SIMULATE=no-native-bf16 for the engine (the probe's
answer on a CPU without native bf16) and adds the precision "auto": what such a machine gets.

Side by side at one CPU level: the engine pinned with TOKENROUTER_CPU_LEVEL (its machine record
says the level, the CPU's flags and torch's own level), llama.cpp built for the same level and
run by `--llama-python` in a process of its own (llama_cpp_rounds.py; its build's system info is
recorded). The AVX2 level on any x86 machine with AVX2:

    python3 -m venv /tmp/llama-avx2 && /tmp/llama-avx2/bin/pip install ../shared/wheels/llama-avx2/*.whl
    TOKENROUTER_CPU_LEVEL=avx2 python benchmarks/anchors/bench_cpu_anchor.py --llama-python /tmp/llama-avx2/bin/python \
        --precisions auto --all-systems-in auto --json benchmarks/results/cpu-anchor/avx2.json

    pip install 'tokenrouter[anchor]'    # llama-cpp-python, built from source (~15 min on 2 cores)
    python benchmarks/anchors/bench_cpu_anchor.py --json benchmarks/results/cpu-anchor/anchor.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the checkout, for `benchmarks.*`
from benchmarks.anchors.llama_cpp_rounds import model_round
from benchmarks.engine.bench_routing import tasks_workload
from tokenrouter import store
from tokenrouter.api import chat_ids
from tokenrouter.bench import BenchConfig, machine_info, release_memory, run_bench
from tokenrouter.config import ModelSpec
from tokenrouter.engine import load_tokenizer
from tokenrouter.eval.results import portable
from tokenrouter.policies import BiLD, RStitch, Speculative

THREADS = 2  # cores: the process is pinned to this many, llama.cpp and the engine use them all
MODELS = {"small": "qwen-coder-0.5b", "large": "qwen-coder-1.5b"}
POLICIES = {
    "rstitch": lambda: RStitch(tau=0.03),
    "bild": lambda: BiLD(fallback=0.9, rollback=2.0),
    "speculative-auto": lambda: Speculative(k="auto"),
    "speculative-4": lambda: Speculative(k=4),
}
PRECISION_OPTIONS = {  # BenchConfig dtype, and the ModelSpec fields every model gets
    "gguf": ("auto", {"quantization": "gguf"}),
    "gguf+bf16": ("auto", {"quantization": "gguf+bf16"}),
    "bfloat16": ("bfloat16", {}),
    "float32": ("float32", {}),
    "auto": ("auto", {}),
}


def pin_cores() -> None:
    """This process on exactly THREADS cores (the engine's turns take every usable core), the
    main thread's torch on one (workers and llama.cpp set their own), transformers quiet."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < THREADS:
        raise SystemExit(f"needs {THREADS} cores, this process may use {len(cores)}")
    os.sched_setaffinity(0, cores[:THREADS])
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def prompts(tokenizer, cfg_workload, count: int) -> list[list[int]]:
    sessions = cfg_workload.build(tokenizer, count, seed=0, level=1)
    return [chat_ids(tokenizer, s.messages) for s in sessions]


def llama_elsewhere(python: str, gguf: Path, requests: list[list[int]], max_tokens: int) -> dict:
    """llama.cpp's round under another Python (a llama-cpp-python built for one CPU level), in a
    process of its own (llama_cpp_rounds.py), on this process's cores (it inherits them)."""
    job = {"gguf": str(gguf), "requests": requests, "max_tokens": max_tokens, "threads": THREADS}
    script = Path(__file__).with_name("llama_cpp_rounds.py")
    done = subprocess.run([python, str(script)], input=json.dumps(job), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{python} {script.name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def in_own_thread(fn):
    """fn() in a thread that ends with it. llama.cpp computes in OpenMP parallel regions, and GNU
    OpenMP keeps a thread team for every thread that ran one, for as long as that thread lives;
    with llama.cpp's team alive beside the engine's compute thread's, the teams outnumber the
    cores and OpenMP stops spinning between regions: the engine's 1.5B wrote 22.7 tok/s at C = 1
    with llama.cpp run in this (main) thread before it, 32.1 with llama.cpp run in a thread that
    had ended."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=run, name="llama.cpp")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def engine_round(
    args, paths, precision: str, systems: list[str], round_no: int, say, draft_vocab: int | None = None
) -> list[dict]:
    """One run of `systems` in `precision`; with `draft_vocab`, the small model's head scores only
    that many ids (ModelSpec.draft_vocab), labelled so in the records' precision."""
    dtype, fields = PRECISION_OPTIONS[precision]
    options = {m: dict(fields) for m in paths}
    if draft_vocab is not None:
        options["small"]["draft_vocab"] = draft_vocab
    cfg = BenchConfig(
        models=paths,
        policy=POLICIES["rstitch"](),
        other_policies={k: f() for k, f in POLICIES.items() if k in systems and k != "rstitch"},
        systems=["routed" if s == "rstitch" else s for s in systems],
        workloads=[tasks_workload(args.max_tokens)],
        concurrency=args.concurrency,
        repeats=1,
        min_requests=args.min_requests,
        kv_cache_tokens=args.kv_cache_tokens,
        threads=None,  # the engine's default on CPU: workers take turns, each step on all THREADS cores
        reuse_engines=True,
        seed=round_no,  # a level's prompts differ between rounds, the same for every system in one
        dtype=dtype,
        model_options=options,
    )
    label = precision if draft_vocab is None else f"{precision}, draft_vocab={draft_vocab}"
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    result = anyio.run(lambda: run_bench(cfg, tokenizer, progress=say))
    out = []
    for run in result.runs:
        m = run.metrics()
        out.append(
            {
                "precision": label,
                "system": "rstitch" if run.system == "routed" else run.system,
                "concurrency": run.concurrency,
                "round": round_no,
                **{k: m[k] for k in ("tok_per_s", "wall_s", "output_tokens", "p50_s", "tokens_by_model", "handoffs")},
                "steps": run.steps,
            }
        )
    out.append(
        {"precision": label, "round": round_no, "bench": {k: v for k, v in result.to_dict().items() if k != "runs"}}
    )
    return out


def median_table(records: list[dict], llama: list[dict], concurrency: list[int]) -> str:
    rows = {}
    for r in records:
        if "system" in r:
            rows.setdefault((r["precision"], r["system"], r["concurrency"]), []).append(r["tok_per_s"])
    anchor = {
        m: statistics.median(r["tok_per_s"] for r in llama if r["model"] == m) for m in {r["model"] for r in llama}
    }
    large = {(p, c): statistics.median(v) for (p, s, c), v in rows.items() if s == "large"}
    for p, s, c in rows:  # a draft_vocab run compares with the large model of its precision
        large.setdefault((p, c), large.get((p.split(",")[0], c)))
    lines = [
        "| precision | system | "
        + " | ".join(f"C={c} tok/s" for c in concurrency)
        + " | "
        + " | ".join(f"C={c} x llama.cpp large" for c in concurrency)
        + " | "
        + " | ".join(f"C={c} x large alone" for c in concurrency)
        + " |",
        "|---|---|" + "---:|" * (3 * len(concurrency)),
    ]
    for m, v in sorted(anchor.items()):
        lines.append(
            f"| llama.cpp Q4_K_M | {m} alone | "
            + " | ".join(f"{v:.1f}" for _ in concurrency)
            + " | "
            + " | ".join(f"{v / anchor.get('large', v):.2f}" for _ in concurrency)
            + " | "
            + " | ".join("" for _ in concurrency)
            + " |"
        )
    for p, s in dict.fromkeys((p, s) for p, s, _ in rows):
        med = {c: statistics.median(rows[(p, s, c)]) if (p, s, c) in rows else None for c in concurrency}
        cells = [f"{med[c]:.1f}" if med[c] else "" for c in concurrency]
        vs_anchor = [f"{med[c] / anchor['large']:.2f}" if med[c] and "large" in anchor else "" for c in concurrency]
        vs_large = [f"{med[c] / large[(p, c)]:.2f}" if med[c] and large.get((p, c)) else "" for c in concurrency]
        lines.append(f"| {p} | {s} | " + " | ".join(cells + vs_anchor + vs_large) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> None:
    if args.llama_python:
        run_llama = lambda gguf, requests: llama_elsewhere(args.llama_python, gguf, requests, args.max_tokens)  # noqa: E731
    else:
        from llama_cpp import Llama

        run_llama = lambda gguf, requests: in_own_thread(  # noqa: E731
            lambda: model_round(Llama, str(gguf), requests, args.max_tokens, THREADS)
        )

    if args.simulate_no_bf16:
        os.environ["TOKENROUTER_PROBE_SIMULATE"] = "no-native-bf16"
    paths = {m: str(store.ensure_model(name)) for m, name in MODELS.items()}
    ggufs = {m: store.gguf_for(p) for m, p in paths.items()}
    tokenizer = load_tokenizer(ModelSpec(path=paths["small"]))
    command = shlex.join(["python", *sys.argv])
    print(f"# {command}", flush=True)
    all_systems = ["large", "small", *POLICIES]
    records: list[dict] = []
    llama: list[dict] = []
    for r in range(args.repeats):
        requests = prompts(tokenizer, tasks_workload(args.max_tokens), args.min_requests)
        for m in args.llama_models:
            res = run_llama(ggufs[m], requests)
            llama.append({"model": m, "round": r, **res})
            print(f"round {r + 1}: llama.cpp {m}: {res['tok_per_s']:.1f} tok/s", flush=True)
            release_memory()
        for p in args.precisions:
            systems = all_systems if p in args.all_systems_in else ["large", "small"]
            systems = [s for s in systems if not args.systems or s in args.systems]
            records += engine_round(
                args, paths, p, systems, r, lambda line: print(f"round {r + 1} {p}: {line}", flush=True)
            )
            if args.draft_vocab and p in args.all_systems_in:  # the lossless systems with a narrow drafter head
                lossless = [s for s in ("speculative-4", "speculative-auto") if s in systems]
                records += engine_round(
                    args,
                    paths,
                    p,
                    lossless,
                    r,
                    lambda line: print(f"round {r + 1} {p} draft_vocab: {line}", flush=True),
                    args.draft_vocab,
                )
        table = median_table(records, llama, args.concurrency)
        print(table, flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(
                portable(  # no place on this machine: the store as $TOKENROUTER_HOME, the checkout relative
                    json.dumps(
                        {
                            "command": command,
                            "machine": machine_info(),
                            "models": {m: {"store": MODELS[m], "gguf": ggufs[m].name} for m in MODELS},
                            "policies": {k: repr(f()) for k, f in POLICIES.items()},
                            "max_tokens": args.max_tokens,
                            "rounds_done": r + 1,
                            "llama_cpp": llama,
                            "engine": records,
                            "table": table,
                        },
                        indent=1,
                    )
                )
                + "\n"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--precisions", nargs="+", default=["gguf+bf16", "gguf", "bfloat16", "float32"], choices=list(PRECISION_OPTIONS)
    )
    p.add_argument(
        "--all-systems-in",
        nargs="*",
        default=["gguf+bf16"],
        help="precisions that run every system (default: the default)",
    )
    p.add_argument("--systems", nargs="+", help="only these engine systems (default: all)")
    p.add_argument("--llama-models", nargs="*", default=["large", "small"], help="llama.cpp runs (none: skip)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--max-tokens", type=int, default=64, help="tokens every request writes (EOS ignored)")
    p.add_argument("--min-requests", type=int, default=4, help="requests per level: max(this, C)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-cache-tokens", type=int, default=8192)
    p.add_argument(
        "--draft-vocab",
        type=int,
        help="also run the Speculative systems with the small model's head on its first N ids (draft_vocab)",
    )
    p.add_argument("--simulate-no-bf16", action="store_true", help="the probe answers as on a CPU without bf16")
    p.add_argument(
        "--llama-python",
        help="run llama.cpp under this Python (its llama-cpp-python built for one CPU level), in its own process",
    )
    p.add_argument("--json", help="write every run, the medians and the machine here (after each round)")
    a = p.parse_args()
    pin_cores()
    main(a)
