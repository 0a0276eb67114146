"""Run every system on the same models, prompts, concurrency levels and KV budget.

Repeats are interleaved: round r runs every system once over every workload and level. For each
(workload, C, system) and repeat: a fresh engine (its prefix cache would otherwise hold the
prompts of earlier runs), a warm-up request, then one measured run (`closed_loop.py`).
`reuse_engines=True` (what `--quick` does) loads each system's engine once a round for all its
runs of the round instead, which saves minutes of loading on real models, and forgets its prefix
cache before each run (`Engine.reset_prefix_cache()`), so every run starts as cold as on a fresh
engine. `order="levels"` runs every system at one level before the next level (the GPU kit's order:
a run cut short keeps every baseline of the levels it finished); with `reuse_engines` every system's
engine then stays loaded for the round. `checkpoint` gets the result so far after each run.

The prompts of every level are built before any engine loads, and the KV budget sized from them,
so every system gets the same work and the same memory; `results.py` gathers what the runs gave.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..api import Engine
from .closed_loop import measure
from .engines import open_engine, release_memory
from .metrics import Run
from .results import BenchResult, collect
from .sessions import Session
from .settings import BenchConfig, BenchError

MIN_KV_TOKENS = 8192


def _kv_budget(cfg: BenchConfig, plan: dict[tuple[str, int], list[Session]]) -> int:
    need = {key: max(s.context_tokens() for s in sessions) for key, sessions in plan.items()}
    if cfg.kv_cache_tokens is not None:
        for (w, c), n in need.items():
            if n > cfg.kv_cache_tokens:
                raise BenchError(
                    f"kv_cache_tokens: {cfg.kv_cache_tokens} is too small for workload {w!r}: a session needs up to "
                    f"{n} tokens (raise --kv-cache-tokens, or lower --max-tokens / --history-tokens / --turns)"
                )
        return cfg.kv_cache_tokens
    most = max(need[(w, c)] * min(c, len(plan[(w, c)])) for (w, c) in plan)
    return max(MIN_KV_TOKENS, -(-most // 1024) * 1024)


def _check_context(engine: Engine, cfg: BenchConfig, plan: dict[tuple[str, int], list[Session]]) -> None:
    limit = min(model.max_model_len for model in engine.info().models.values())
    for (w, _), sessions in plan.items():
        n = max(s.context_tokens() for s in sessions)
        if n > limit:
            raise BenchError(
                f"workload {w!r} needs up to {n} tokens of context, but the models hold {limit} "
                "(lower --max-tokens / --history-tokens / --turns)"
            )


async def _close(engines: dict[str, Engine]) -> None:
    """Close every open engine and give its memory back."""
    if engines:
        for system in list(engines):
            await engines.pop(system).close()
        release_memory()


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _line(run: Run, models: list[str]) -> str:
    m, sec = run.metrics(), _sec
    tokens = "/".join(str(m["tokens_by_model"].get(x, 0)) for x in models)
    return (
        f"{run.workload} C={run.concurrency} {run.system} #{run.repeat + 1}: {m['tok_per_s']:.2f} tok/s"
        f"{' (cut short)' if run.cut_short else ''}, p50 {sec(m['p50_s'])}, p99 {sec(m['p99_s'])}, "
        f"TTFT p50 {sec(m['ttft_p50_s'])}, {m['requests_completed']}/{m['requests_total']} requests, "
        f"tokens {'/'.join(models)} {tokens}, {m['handoffs']} hand-offs, wall {run.wall_s:.1f} s"
    )


async def run_bench(
    cfg: BenchConfig,
    tokenizer,
    *,
    command: str = "",
    progress: Callable[[str], None] | None = None,
    checkpoint: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Run the whole benchmark. `tokenizer` is the entry model's: workloads are sized with it."""
    cfg.check()
    say = progress or (lambda _: None)
    t_start = time.perf_counter()
    plan = {
        (w.name, c): w.build(tokenizer, cfg.sessions(c), seed=cfg.seed, level=c)
        for w in cfg.workloads
        for c in cfg.concurrency
    }
    kv = _kv_budget(cfg, plan)
    # Repeats are interleaved: each round runs every system once (over every workload and level),
    # so a drift of the machine hits one repeat of each system rather than every repeat of one.
    # With reuse_engines a system's engine serves all its runs of a round.
    jobs = [
        (w, c, s, r) for r in range(cfg.repeats) for s in cfg.systems for w in cfg.workloads for c in cfg.concurrency
    ]
    if cfg.order == "levels":  # the same runs, every system at one level before the next (a stable sort)
        level = {(w.name, c): i for i, (w, c) in enumerate((w, c) for w in cfg.workloads for c in cfg.concurrency)}
        jobs.sort(key=lambda job: (job[3], level[(job[0].name, job[1])]))
    models = ", ".join(f"{m}={Path(p).name}" for m, p in cfg.models.items())
    say(
        f"bench: {len(jobs)} runs: {', '.join(w.name for w in cfg.workloads)} x C {' '.join(map(str, cfg.concurrency))}"
        f" x {', '.join(cfg.systems)} x {cfg.repeats}; {models}; {cfg.policy!r}; KV {kv} tokens per model"
    )
    runs: list[Run] = []
    profiles: dict[str, dict] = {}
    engines: dict[str, Engine] = {}  # open engines by system: one, or with order "levels" and reuse, all
    keep_all = cfg.reuse_engines and cfg.order == "levels"
    checked = False

    def result() -> BenchResult:
        return collect(cfg, plan, list(runs), kv_cache_tokens=kv, profiles=profiles, command=command, started=t_start)

    try:
        for i, (w, c, system, repeat) in enumerate(jobs):
            # a fresh engine for every run, or (reuse_engines) one per system, kept while it serves
            if (system not in engines and not keep_all) or (system in engines and not cfg.reuse_engines):
                await _close(engines)
            if system not in engines:
                engines[system] = await open_engine(cfg, system, kv)
                engine = engines[system]
                planned_with = engine.info().profiles
                if planned_with:  # k="auto" or delayed_batching="auto" planned with these
                    profiles.setdefault(system, {m: p.to_json() for m, p in planned_with.items()})
                if not checked:
                    _check_context(engine, cfg, plan)
                    checked = True
            engine = engines[system]
            if cfg.reuse_engines:
                await engine.reset_prefix_cache()  # cold, as a fresh engine would be
            run = await measure(
                engine, plan[(w.name, c)], c, max_run_s=cfg.max_run_s, workload=w.name, system=system, repeat=repeat
            )
            runs.append(run)
            say(f"[{i + 1}/{len(jobs)}] {_line(run, list(cfg.models))}")
            if checkpoint is not None:
                checkpoint(result())
            failed = next((t for t in run.turns if t.error is not None), None)
            if failed is not None:
                raise BenchError(
                    f"{w.name} C={c} {system}: session {failed.session} turn {failed.turn} failed: {failed.error}"
                )
    finally:
        await _close(engines)
    return result()
