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
    python benchmarks/bench_single.py                          # default run (~15 min on 2 cores)
    python benchmarks/bench_single.py --quick                  # ~2 min smoke run
    python benchmarks/bench_single.py --concurrency 1 16 --json out.json
    python benchmarks/bench_single.py --model /path/to/model.gguf      # slow: a GGUF loads in ~25 s per run
    python benchmarks/bench_single.py --profile /tmp/prof              # py-spy the first engine run per C
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from hf_baselines import RunResult, hf_cb_measure, hf_generate_measure, hf_generate_run, load_hf, per_request

from tokenrouter import ModelSpec
from tokenrouter.bench.closed_loop import measure
from tokenrouter.bench.machine import CpuMeter, machine_info
from tokenrouter.bench.metrics import percentile
from tokenrouter.bench.sessions import Session
from tokenrouter.engine.model.loader import load_tokenizer

NUM_THREADS = 2
# The main thread stays at one torch thread and runs no multi-threaded op: with GNU OpenMP, a second
# live OpenMP team makes libgomp stop spinning and slows every op ~25%. Each system steps in a thread
# of its own that sets NUM_THREADS itself (the engine's workers; `in_fresh_thread` for the HF systems).
torch.set_num_threads(1)


def in_fresh_thread(fn, *args):
    """Run fn in a new thread with NUM_THREADS torch threads, and join it (its OpenMP team dies with it)."""
    import threading

    box: dict = {}

    def target():
        torch.set_num_threads(NUM_THREADS)
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    th = threading.Thread(target=target)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


SYSTEMS = ("engine", "hf_generate_onednn", "hf_generate", "hf_cb")

# Deterministic prompt material: an instruction plus filler words, lengthened to a target token count.
_INSTRUCTIONS = [
    "Explain in simple terms how {a} relates to {b}.",
    "Write a short story about {a} and {b}.",
    "Give me a list of tips about {a}, keeping {b} in mind.",
    "Summarize the following notes on {a}:",
    "What are the pros and cons of {a} compared with {b}?",
    "Translate these thoughts about {a} into plain English:",
    "Write a poem that mentions {a}, {b} and the sea.",
    "Describe a day in the life of someone who studies {a}.",
]
_WORDS = [
    "river",
    "mountain",
    "engine",
    "garden",
    "library",
    "coffee",
    "window",
    "planet",
    "signal",
    "market",
    "winter",
    "orange",
    "theory",
    "bridge",
    "forest",
    "music",
    "number",
    "kitchen",
    "ocean",
    "silver",
    "travel",
    "camera",
    "history",
    "language",
    "pencil",
    "harbor",
    "storm",
    "network",
    "sunlight",
    "school",
    "bicycle",
    "castle",
    "memory",
    "paper",
    "energy",
    "island",
    "doctor",
    "village",
    "science",
    "morning",
    "dragon",
    "letter",
    "season",
    "battery",
    "cloud",
    "desert",
    "violin",
    "museum",
    "recipe",
    "rocket",
    "shadow",
    "teacher",
    "garden",
    "puzzle",
    "lantern",
    "canyon",
    "festival",
    "compass",
    "meadow",
    "circuit",
    "glacier",
    "orchard",
    "telescope",
]


# ---- prompts ---------------------------------------------------------------------------------
def build_prompts(tokenizer, n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """n chat-formatted prompts (token ids, with the generation prompt), lengths about uniform in [lo, hi]."""
    from tokenrouter.api.prompts import chat_ids

    rng = random.Random(seed)
    prompts = []

    def encode(text: str) -> list[int]:
        return chat_ids(tokenizer, [{"role": "user", "content": text}])

    for _ in range(n):
        target = rng.randint(lo, hi)
        a, b = rng.sample(_WORDS, 2)
        text = rng.choice(_INSTRUCTIONS).format(a=a, b=b)
        ids = encode(text)
        # add words in chunks while far from the target, then one at a time
        while len(ids) < target:
            missing = target - len(ids)
            k = max(1, missing // 2)
            text += " " + " ".join(rng.choice(_WORDS) for _ in range(k))
            ids = encode(text)
        prompts.append(ids)
    return prompts


# ---- results ---------------------------------------------------------------------------------


def check_lengths(name: str, res: RunResult, lengths: list[int]) -> None:
    bad = [i for i, t in enumerate(res.tokens) if len(t) != lengths[i]]
    if bad:
        raise RuntimeError(
            f"{name}: {len(bad)} request(s) did not produce their {lengths[bad[0]]} tokens "
            f"(e.g. prompt {bad[0]}: {len(res.tokens[bad[0]])})"
        )


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _load(res: RunResult) -> str:
    e = res.extra
    return f" (cpu: self {e.get('cpu_self_cores', 0):.2f}, others {e.get('cpu_foreign_cores', 0):.2f} cores)"


# ---- (a) the engine ----------------------------------------------------------------------------


async def engine_run(engine, prompts, concurrency: int, max_tokens) -> RunResult:
    """A closed loop keeping `concurrency` requests in flight over the prompts (token ids), through
    tokenrouter.bench's harness: the same client, timings and KV check as `tokenrouter bench`."""
    lengths = per_request(max_tokens, len(prompts))
    sessions = [Session(messages=p, max_tokens=[n]) for p, n in zip(prompts, lengths)]
    s0 = engine.stats()["m"]
    run = await measure(engine, sessions, concurrency, system="engine")
    s1 = engine.stats()["m"]
    failed = [t for t in run.turns if t.error is not None]
    if failed:
        raise RuntimeError(f"engine: {len(failed)} request(s) failed: {failed[0].error}")
    if not run.kv_freed:
        raise RuntimeError("engine: KV blocks were still held after the run")
    d_fwd = s1.time_forward_s - s0.time_forward_s
    d_step = s1.time_step_s - s0.time_step_s
    hist = {k: v - s0.batch_size_histogram.get(k, 0) for k, v in s1.batch_size_histogram.items()}
    extra = {
        "overhead_frac": 1.0 - d_fwd / d_step if d_step > 0 else float("nan"),
        "time_forward_s": d_fwd,
        "time_step_s": d_step,
        "time_idle_s": s1.time_idle_s - s0.time_idle_s,
        "step_frac_of_wall": d_step / run.wall_s,
        "steps": s1.steps - s0.steps,
        "preemptions": s1.preemptions - s0.preemptions,
        "prefix_cache_hit_tokens": s1.prefix_cache_hit_tokens - s0.prefix_cache_hit_tokens,
        "batch_size_histogram": {k: v for k, v in hist.items() if v},
        "ttft_p50_s": percentile([t.ttft_s for t in run.turns if t.ttft_s is not None], 0.5),
    }
    return RunResult(run.wall_s, [t.latency_s for t in run.turns], [t.token_ids for t in run.turns], extra)


def engine_spec(args, model_path: Path):
    from tokenrouter import ModelSpec

    return ModelSpec(
        path=model_path,
        dtype=args.dtype,
        device=args.device,
        kv_cache_tokens=args.kv_cache_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=max(args.max_num_seqs, max(args.concurrency)),
        prefill_backend=args.prefill_backend,
    )


async def engine_measure(args, spec, prompts, lengths, warm_prompts, c: int, profile: str | None) -> RunResult:
    """One measured run on a fresh Engine: its prefix cache must not hold earlier runs' prompts."""
    from tokenrouter import Engine

    t = time.perf_counter()
    async with Engine(models={"m": spec}, num_threads=NUM_THREADS) as engine:
        load_s = time.perf_counter() - t
        await engine_run(engine, warm_prompts[: args.warmup_prompts], c, args.warmup_tokens)
        prof = _start_profile(args.profile, profile) if (args.profile and profile) else None
        with CpuMeter() as cpu:
            res = await engine_run(engine, prompts, c, lengths)
        res.with_cpu(cpu)
        if prof is not None:
            prof.stop()
        st = engine.stats()["m"]
        res.extra.update(load_s=load_s, kv_blocks_total=st.kv_blocks_total, kv_block_size=st.kv_block_size)
    return res


# ---- (b) HF generate, static batches -------------------------------------------------------------


# ---- (c) transformers continuous batching --------------------------------------------------------


# ---- profiling (py-spy on this process, optional) -------------------------------------------------
class _PySpy:
    def __init__(self, proc, path):
        self.proc, self.path = proc, path

    def stop(self):
        import signal
        import subprocess

        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        log(f"py-spy profile written to {self.path}")


def _start_profile(profile_dir: Path, name: str):
    import shutil
    import subprocess

    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log("py-spy not found: no profile")
        return None
    profile_dir.mkdir(parents=True, exist_ok=True)
    path = profile_dir / f"{name}.txt"
    cmd = [
        exe,
        "record",
        "--pid",
        str(os.getpid()),
        "--format",
        "raw",
        "--rate",
        "100",
        "--threads",
        "--nonblocking",
        "-o",
        str(path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return _PySpy(proc, path)


# ---- report ----------------------------------------------------------------------------------
def median_summary(runs: list[RunResult]) -> dict:
    sums = [r.summary() for r in runs]
    keys = [k for k, v in sums[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(s[k] for s in sums) for k in keys}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict:
    same = sum(a == b for a, b in zip(ref, other))
    div = [first_divergence(a, b) for a, b in zip(ref, other)]
    return {"identical": same, "of": len(ref), "first_divergence": div}


def main(argv: list[str] | None = None) -> int:
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
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if torch.device(args.device).type == "cpu" else "bfloat16"
    if args.quick:
        args.num_prompts, args.max_tokens, args.repeats, args.warmup_prompts = 16, 16, 1, 2
        args.max_prompt_tokens = min(args.max_prompt_tokens, 64)
    if min(args.concurrency) < 1 or args.repeats < 1 or (args.num_prompts is not None and args.num_prompts < 1):
        p.error("concurrency, repeats and num-prompts must be >= 1")

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

    tok = load_tokenizer(ModelSpec(path=model_path))

    def num_prompts(c: int) -> int:
        return args.num_prompts or max(8, 2 * c)

    n_max = max(num_prompts(c) for c in args.concurrency)
    prompts = build_prompts(tok, n_max, args.min_prompt_tokens, args.max_prompt_tokens, args.seed)
    rng = random.Random(args.seed + 1)
    lengths = [
        args.max_tokens
        if args.output_lengths == "fixed"
        else rng.randint(max(1, args.max_tokens // 4), args.max_tokens)
        for _ in prompts
    ]
    warm_prompts = build_prompts(
        tok,
        max(args.warmup_prompts, max(args.concurrency)),
        args.min_prompt_tokens,
        args.max_prompt_tokens,
        args.seed + 7919,
    )  # distinct from the measured prompts, so no prefix cache ever holds a measured prompt
    plens = [len(x) for x in prompts]
    log(
        f"{len(prompts)} prompts, {min(plens)}-{max(plens)} tokens (mean {statistics.fmean(plens):.0f}); "
        f"{args.output_lengths} output lengths up to {args.max_tokens} (mean {statistics.fmean(lengths):.0f})"
    )
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    if "hf_generate_onednn" in args.systems and (torch.device(args.device).type != "cpu" or args.dtype != "float32"):
        args.systems = [s for s in args.systems if s != "hf_generate_onednn"]
        log("hf_generate_onednn skipped: the oneDNN layers are for float32 on CPU")
    results: dict[str, dict] = {name: {} for name in SYSTEMS if name in args.systems}
    timings: dict[str, float] = dict.fromkeys(results, 0.0)
    t = time.perf_counter()
    # for hf_generate, hf_cb and the batch-1 token check
    model = in_fresh_thread(load_hf, model_path, args.dtype, args.device)
    log(f"hf: loaded in {time.perf_counter() - t:.1f} s")
    hf_models = {"hf_generate": model}
    if "hf_generate_onednn" in results:
        hf_models["hf_generate_onednn"] = in_fresh_thread(load_hf, model_path, args.dtype, args.device, True)
    spec = engine_spec(args, model_path) if "engine" in args.systems else None
    # Interleaved: for each concurrency and repeat, every system runs once, so a burst of load from
    # other processes hits one repeat of every system rather than every repeat of one system.
    for c in args.concurrency:
        for r in range(args.repeats):
            for name in list(results):
                t = time.perf_counter()
                pr, ln = prompts[: num_prompts(c)], lengths[: num_prompts(c)]
                if name == "engine":
                    prof = f"engine_c{c}" if r == 0 else None
                    res = asyncio.run(engine_measure(args, spec, pr, ln, warm_prompts, c, prof))
                    note = f", overhead {res.extra['overhead_frac']:.1%}"
                elif name in hf_models:
                    hf = hf_models[name]
                    res, note = in_fresh_thread(hf_generate_measure, args, hf, pad_id, pr, ln, warm_prompts, c), ""
                else:
                    res, note = in_fresh_thread(hf_cb_measure, args, model, pr, ln, warm_prompts, c), ""
                timings[name] += time.perf_counter() - t
                check_lengths(name, res, ln)
                results[name].setdefault(c, []).append(res)
                log(f"{name} c={c} repeat {r + 1}: {res.tok_per_s:.1f} tok/s{note}{_load(res)}")

    # ---- correctness: engine greedy tokens vs HF generate at batch 1 --------------------------
    checks: dict = {}
    warnings: list[str] = []
    ref_b1 = None
    if "hf_generate" in results and 1 in results["hf_generate"]:
        ref_b1 = results["hf_generate"][1][0].tokens
    elif "engine" in results:
        ref_b1 = in_fresh_thread(hf_generate_run, model, pad_id, prompts[:2], 1, lengths[:2]).tokens
    if ref_b1 is not None:
        for name, res in results.items():
            for c, runs in res.items():
                if not isinstance(c, int) or (name == "hf_generate" and c == 1):
                    continue
                toks = runs[0].tokens[: len(ref_b1)]
                checks[f"{name}_c{c}_vs_hf_generate_b1"] = agreement(ref_b1, toks)
        eng1 = results.get("engine", {}).get(1)
        if eng1 is None and "engine" in results:
            eng1 = next(v for k, v in results["engine"].items() if isinstance(k, int))
        if eng1 is not None:
            for i in range(min(2, len(ref_b1))):
                d = first_divergence(ref_b1[i], eng1[0].tokens[i])
                if d is not None:
                    warnings.append(
                        f"WARNING: prompt {i}: engine greedy tokens differ from HF generate (batch 1) "
                        f"from output position {d} (float32 near-ties can flip)"
                    )

    # ---- table -----------------------------------------------------------------------------------
    summary: dict = {}
    for name, res in results.items():
        for c, runs in res.items():
            if isinstance(c, int):
                summary.setdefault(name, {})[c] = median_summary(runs)
    print()
    print(
        f"model: {model_path} | {len(prompts)} prompts of {min(plens)}-{max(plens)} tokens "
        f"(mean {statistics.fmean(plens):.0f}) | {args.output_lengths} output lengths up to {args.max_tokens}, "
        f"greedy, EOS ignored | "
        f"{NUM_THREADS} threads | median of {args.repeats} repeat(s)"
    )
    print()
    print(
        "| system | concurrency | tok/s | p50 latency (s) | p99 latency (s) | vs static generate, same kernels "
        "| vs static generate | engine overhead | CPU cores: this process / others |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        same = summary.get("hf_generate_onednn", {}).get(c, {}).get("tok_per_s")
        base = summary.get("hf_generate", {}).get(c, {}).get("tok_per_s")
        for name in SYSTEMS:
            s = summary.get(name, {}).get(c)
            if s is None:
                continue
            ratio_same = f"{s['tok_per_s'] / same:.2f}x" if same else "-"
            ratio = f"{s['tok_per_s'] / base:.2f}x" if base else "-"
            ovh = f"{s['overhead_frac']:.1%}" if "overhead_frac" in s else "-"
            print(
                f"| {name} | {c} | {s['tok_per_s']:.1f} | {s['p50_s']:.2f} | {s['p99_s']:.2f} "
                f"| {ratio_same} | {ratio} | {ovh} "
                f"| {s.get('cpu_self_cores', float('nan')):.2f} / {s.get('cpu_foreign_cores', float('nan')):.2f} |"
            )
    print()
    for k, v in checks.items():
        print(f"tokens {k}: {v['identical']}/{v['of']} identical")
    busiest = max(
        (
            r.extra.get("cpu_foreign_cores", 0.0)
            for res in results.values()
            for c, runs in res.items()
            if isinstance(c, int)
            for r in runs
        ),
        default=0.0,
    )
    if busiest > 0.25:
        warnings.append(
            f"WARNING: other processes used up to {busiest:.2f} of the {os.cpu_count()} cores during a measured run; "
            "the numbers are distorted (rerun on a quiet machine)"
        )
    for w in warnings:
        print(w)
    total = time.perf_counter() - t_start
    print(f"wall time: {total:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ")")

    if args.json:
        raw = {
            name: {
                str(c): ([{**r.summary(), "latencies_s": r.latencies_s} for r in runs] if isinstance(c, int) else runs)
                for c, runs in res.items()
            }
            for name, res in results.items()
        }
        doc = {
            "command": [sys.executable, *sys.argv],
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "model_path": str(model_path),
            "env": {**machine_info(), "threads": NUM_THREADS},
            "prompt_lengths": plens,
            "summary": {n: {str(c): s for c, s in d.items()} for n, d in summary.items()},
            "runs": raw,
            "token_checks": checks,
            "warnings": warnings,
            "timings_s": {**timings, "total": total},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
