"""The single-model benchmark's report: the table of medians over the repeats (each system against static
generate at the same concurrency), the token checks, a warning where other processes loaded the machine, and
the JSON of every raw number."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.anchors.hf_baselines import RunResult
from benchmarks.anchors.single_runs import NUM_THREADS, SYSTEMS, Runs
from benchmarks.anchors.single_workload import Workload
from benchmarks.bench_log import log
from tokenrouter.bench import machine_info


def median_summary(runs: list[RunResult]) -> dict:
    sums = [r.summary() for r in runs]
    keys = [k for k, v in sums[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(s[k] for s in sums) for k in keys}


def medians(runs: Runs) -> dict:
    """{system: {concurrency: the median over its repeats of each number}}."""
    summary: dict = {}
    for name, res in runs.results.items():
        for c, system_runs in res.items():
            if isinstance(c, int):
                summary.setdefault(name, {})[c] = median_summary(system_runs)
    return summary


def print_table(args, model_path: Path, work: Workload, summary: dict, checks: dict) -> None:
    plens = work.prompt_lengths
    print()
    print(
        f"model: {model_path} | {len(work.prompts)} prompts of {min(plens)}-{max(plens)} tokens "
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


def load_warning(runs: Runs) -> str | None:
    """A warning where other processes used over a quarter of a core during some measured run."""
    busiest = max(
        (
            r.extra.get("cpu_foreign_cores", 0.0)
            for res in runs.results.values()
            for c, system_runs in res.items()
            if isinstance(c, int)
            for r in system_runs
        ),
        default=0.0,
    )
    if busiest <= 0.25:
        return None
    return (
        f"WARNING: other processes used up to {busiest:.2f} of the {os.cpu_count()} cores during a measured run; "
        "the numbers are distorted (rerun on a quiet machine)"
    )


def write_json(
    args, model_path: Path, work: Workload, runs: Runs, summary: dict, checks: dict, warnings: list[str], total: float
) -> None:
    """Every raw number to --json: each run's summary and latencies, the medians, the checks, the timings."""
    raw = {
        name: {
            str(c): (
                [{**r.summary(), "latencies_s": r.latencies_s} for r in system_runs]
                if isinstance(c, int)
                else system_runs
            )
            for c, system_runs in res.items()
        }
        for name, res in runs.results.items()
    }
    doc = {
        "command": [sys.executable, *sys.argv],
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model_path": str(model_path),
        "env": {**machine_info(), "threads": NUM_THREADS},
        "prompt_lengths": work.prompt_lengths,
        "summary": {n: {str(c): s for c, s in d.items()} for n, d in summary.items()},
        "runs": raw,
        "token_checks": checks,
        "warnings": warnings,
        "timings_s": {**runs.timings, "total": total},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1))
    log(f"wrote {args.json}")
