"""The measured runs of the single-model benchmark (bench_single.py), interleaved: for each concurrency and
repeat, every system once, so that a burst of load from other processes hits one repeat of every system
rather than every repeat of one. Each system steps in a thread of its own with NUM_THREADS torch threads."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.anchors.engine_runs import engine_measure, engine_spec
from benchmarks.anchors.hf_baselines import RunResult, hf_cb_measure, hf_generate_measure, load_hf
from benchmarks.anchors.single_workload import Workload
from benchmarks.bench_log import log

NUM_THREADS = 2
SYSTEMS = ("engine", "hf_generate_onednn", "hf_generate", "hf_cb")


def in_fresh_thread(fn, *args):
    """Run fn in a new thread with NUM_THREADS torch threads, and join it (its OpenMP team dies with it)."""
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


@dataclass
class Runs:
    """Every measured run, by system and concurrency (in order of repeat); the seconds each system took,
    loading and warm-up included; the Hugging Face model the baselines and the token check use."""

    results: dict[str, dict[int, list[RunResult]]]
    timings: dict[str, float]
    model: object


def check_lengths(name: str, res: RunResult, lengths: list[int]) -> None:
    bad = [i for i, t in enumerate(res.tokens) if len(t) != lengths[i]]
    if bad:
        raise RuntimeError(
            f"{name}: {len(bad)} request(s) did not produce their {lengths[bad[0]]} tokens "
            f"(e.g. prompt {bad[0]}: {len(res.tokens[bad[0]])})"
        )


def cpu_load(res: RunResult) -> str:
    e = res.extra
    return f" (cpu: self {e.get('cpu_self_cores', 0):.2f}, others {e.get('cpu_foreign_cores', 0):.2f} cores)"


def run_interleaved(args, model_path: Path, work: Workload) -> Runs:
    """Every system of `args.systems` at every concurrency, `args.repeats` times, interleaved."""
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
    for c in args.concurrency:
        for r in range(args.repeats):
            for name in list(results):
                t = time.perf_counter()
                pr, ln = work.prompts[: work.num_prompts(c)], work.lengths[: work.num_prompts(c)]
                if name == "engine":
                    prof = f"engine_c{c}" if r == 0 else None
                    res = asyncio.run(engine_measure(args, spec, pr, ln, work.warm_prompts, c, prof, NUM_THREADS))
                    note = f", overhead {res.extra['overhead_frac']:.1%}"
                elif name in hf_models:
                    hf = hf_models[name]
                    res = in_fresh_thread(hf_generate_measure, args, hf, work.pad_id, pr, ln, work.warm_prompts, c)
                    note = ""
                else:
                    res, note = in_fresh_thread(hf_cb_measure, args, model, pr, ln, work.warm_prompts, c), ""
                timings[name] += time.perf_counter() - t
                check_lengths(name, res, ln)
                results[name].setdefault(c, []).append(res)
                log(f"{name} c={c} repeat {r + 1}: {res.tok_per_s:.1f} tok/s{note}{cpu_load(res)}")
    return Runs(results, timings, model)
