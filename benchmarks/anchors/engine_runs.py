"""The engine's side of the single-model benchmark (bench_single.py): a closed-loop client keeping at most C
requests in flight through tokenrouter.bench's harness, on a fresh Engine for every measured run, with the
worker's step and forward times over the run."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.anchors.hf_baselines import RunResult, per_request
from benchmarks.anchors.py_spy_profile import start_profile
from tokenrouter import Engine, ModelSpec
from tokenrouter.bench import Session, measure, percentile
from tokenrouter.bench.machine import CpuMeter


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


def engine_spec(args, model_path: Path) -> ModelSpec:
    """The engine's model: bench_single.py's options, with room for the highest concurrency's requests."""
    return ModelSpec(
        path=model_path,
        dtype=args.dtype,
        device=args.device,
        kv_cache_tokens=args.kv_cache_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=max(args.max_num_seqs, max(args.concurrency)),
        prefill_backend=args.prefill_backend,
        **({} if args.cuda_graph_max_batch is None else {"cuda_graph_max_batch": args.cuda_graph_max_batch}),
    )


async def engine_measure(
    args, spec, prompts, lengths, warm_prompts, c: int, profile: str | None, num_threads: int
) -> RunResult:
    """One measured run on a fresh Engine: its prefix cache must not hold earlier runs' prompts. `profile`
    names a py-spy profile of the measured run (with --profile)."""
    t = time.perf_counter()
    async with Engine(models={"m": spec}, num_threads=num_threads) as engine:
        load_s = time.perf_counter() - t
        await engine_run(engine, warm_prompts[: args.warmup_prompts], c, args.warmup_tokens)
        prof = start_profile(args.profile, profile) if (args.profile and profile) else None
        with CpuMeter() as cpu:
            res = await engine_run(engine, prompts, c, lengths)
        res.with_cpu(cpu)
        if prof is not None:
            prof.stop()
        st = engine.stats()["m"]
        res.extra.update(load_s=load_s, kv_blocks_total=st.kv_blocks_total, kv_block_size=st.kv_block_size)
    return res
