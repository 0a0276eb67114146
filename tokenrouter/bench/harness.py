"""Run every system on the same models, prompts, concurrency levels and KV budget.

Repeats are interleaved: round r runs every system once over every workload and level. For each
(workload, C, system) and repeat: a fresh engine (its prefix cache would otherwise hold the
prompts of earlier runs), a warm-up request, then one measured run: a closed loop keeping C
sessions in flight over a fixed set (a short or long request is a one-turn session; an agentic
session runs its turns in sequence), each through `engine.stream`, so times are the client's.
`reuse_engines=True` (what `--quick` does) loads each system's engine once a round for all its
runs of the round instead, which saves minutes of loading on real models, and forgets its prefix cache before each
run (`Engine.reset_prefix_cache()`), so every run starts as cold as on a fresh engine.

Greedy outputs are compared across systems (the same tokens, or a warning: float32 near-ties can
flip a token when batches differ). A run cut short by `max_run_s` cancels its in-flight requests,
and the harness checks every KV block came back.
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from ..api import Engine
from ..config import ModelSpec, SamplingParams
from ..engine.worker.cpu_turns import usable_cores
from ..errors import ConfigError, TokenRouterError
from ..policies import Policy
from .machine import machine_info
from .metrics import Run, Summary, Turn
from .systems import SYSTEMS
from .workloads import Session, WorkloadSpec

# Plain text, not through the chat template: short to prefill, and it leaves no block of the
# template in the prefix cache for the measured run to find.
WARMUP_PROMPT = "Hello! Who are you?"
MIN_KV_TOKENS = 8192


class BenchError(TokenRouterError):
    """A benchmark that cannot run as asked, or a request in it failed."""


@dataclass
class BenchConfig:
    """Everything a benchmark run needs. `models` maps the policy's model names to paths."""

    models: dict[str, str | Path]
    policy: Policy
    workloads: list[WorkloadSpec]
    # more ModelSpec fields per model name, in every system that loads it (e.g. {"small8":
    # {"quantization": "int8"}}: the same checkpoint as "small", quantized, under its own name)
    model_options: dict[str, dict] = field(default_factory=dict)
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    # more routed systems, each under its own policy over the same models (e.g. "speculative":
    # Speculative(k="auto") beside RStitch's "routed"); name them in `systems` to run them
    other_policies: dict[str, Policy] = field(default_factory=dict)
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    repeats: int = 3  # interleaved rounds; the tables show medians
    requests: int | None = None  # sessions per level; None: max(min_requests, C)
    min_requests: int = 8  # fewer, and one slow request is the level's throughput
    kv_cache_tokens: int | None = None  # per model; None: every session of the largest level at once, >= 8192
    threads: int | None = None  # torch threads per worker (routed, standard); None: turns on the CPU
    threads_lockstep: int | None = None  # torch threads of lockstep's one stepping thread; None: every core
    max_run_s: float | None = None
    reuse_engines: bool = False
    seed: int = 0
    device: str = "cpu"
    dtype: str = "auto"
    cuda_graph_max_batch: int | None = None  # None: ModelSpec's default; 0: every GPU step eager
    warmup_tokens: int = 8

    def sessions(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(self.min_requests, concurrency)

    def check(self) -> None:
        clash = sorted(set(self.other_policies) & set(SYSTEMS))
        if clash:
            raise ConfigError(f"other_policies: {clash[0]!r} is a built-in system's name")
        unknown = [s for s in self.systems if s not in SYSTEMS and s not in self.other_policies]
        if unknown:
            names = ", ".join([*SYSTEMS, *self.other_policies])
            raise ConfigError(f"systems: unknown {unknown[0]!r}; expected some of {names}")
        if not self.systems or not self.workloads or not self.concurrency:
            raise ConfigError("give at least one system, one workload and one concurrency level")
        for name in (
            "repeats",
            "threads",
            "threads_lockstep",
            "warmup_tokens",
            "requests",
            "min_requests",
            "kv_cache_tokens",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}: must be an integer >= 1, got {value!r}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ConfigError(f"concurrency: every level must be an integer >= 1, got {self.concurrency}")
        if self.max_run_s is not None and not 0 < self.max_run_s < float("inf"):
            raise ConfigError(f"max_run_s: must be a positive number of seconds, got {self.max_run_s!r}")
        for name, policy in {"policy": self.policy, **self.other_policies}.items():
            missing = [m for m in policy.models if m not in self.models]
            if missing:
                raise ConfigError(f"models: {name} names {missing}, which are not given")
        unknown = sorted(set(self.model_options) - set(self.models))
        if unknown:
            raise ConfigError(f"model_options: {unknown[0]!r} is not one of the models ({', '.join(self.models)})")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ConfigError(f"workloads: each may be given once, got {names}")


@dataclass
class BenchResult:
    """Every run, the medians per (workload, C, system), and what produced them."""

    command: str
    models: dict[str, str]
    policy: str
    machine: dict
    settings: dict
    workloads: dict[str, dict]
    runs: list[Run]
    summaries: list[Summary]
    warnings: list[str]
    wall_s: float
    profiles: dict[str, dict] = field(default_factory=dict)  # system: {model: the step-latency profile it planned with}

    def to_dict(self) -> dict:
        return {
            "command": self.command,
            "models": self.models,
            "policy": self.policy,
            "machine": self.machine,
            "settings": self.settings,
            "workloads": self.workloads,
            "warnings": self.warnings,
            "wall_s": self.wall_s,
            "summaries": [s.to_dict() for s in self.summaries],
            "runs": [r.to_dict() for r in self.runs],
            "profiles": self.profiles,
        }


# ---- one measured run ----------------------------------------------------------------------------
def _clean(text: str) -> str:
    """An answer as the next turn's history: a random model may write a NUL byte, which prompts refuse."""
    return text.replace("\x00", "")


async def _run_turn(engine: Engine, messages: list[dict], rec: Turn, t0: float) -> str | None:
    """Stream one request; fill `rec` as it goes. Returns the answer's text once it completed."""
    params = SamplingParams(temperature=0, max_tokens=rec.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    rec.submitted_s = start - t0
    try:
        async with aclosing(engine.stream(messages, params)) as stream:
            async for delta in stream:
                if delta.token_ids:
                    if rec.ttft_s is None:
                        rec.ttft_s = time.perf_counter() - start
                    rec.tokens += len(delta.token_ids)
                    rec.tokens_by_model[delta.model] = rec.tokens_by_model.get(delta.model, 0) + len(delta.token_ids)
                if delta.finish_reason is not None:
                    out = delta.output
                    if delta.finish_reason not in ("stop", "length"):
                        rec.error = f"{delta.finish_reason}: {out.error if out else delta.error}"
                        return None
                    rec.latency_s = time.perf_counter() - start
                    rec.token_ids = list(out.token_ids)
                    rec.tokens_by_model = out.tokens_per_model()
                    rec.handoffs = out.num_handoffs
                    rec.tokens_processed = dict(out.tokens_processed)
                    return out.text
    except TokenRouterError as e:  # refused at submission (e.g. too big for a KV pool)
        rec.error = f"{type(e).__name__}: {e}"
    return None


async def wait_free(engine: Engine, timeout: float = 30.0) -> bool:
    """Whether every worker's KV pool is whole again and nothing is queued, within `timeout`
    (workers free KV asynchronously, after a request ends or is cancelled)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        if all(
            s.kv_blocks_free == s.kv_blocks_total and s.running == 0 and s.waiting == 0 and s.pending == 0
            for s in stats.values()
        ):
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.01)


async def measure(
    engine: Engine,
    sessions: list[Session],
    concurrency: int,
    *,
    max_run_s: float | None = None,
    workload: str = "",
    system: str = "",
    repeat: int = 0,
) -> Run:
    """One closed-loop run: C clients, each taking the next session and running its turns in
    sequence, until every session is done or `max_run_s` passes (then in-flight requests are
    cancelled, which aborts them in every worker)."""
    turns: list[Turn] = []
    queue = iter(range(len(sessions)))
    before = engine.stats()
    t0 = time.perf_counter()

    async def client():
        for i in queue:  # the shared iterator hands each session to one client
            s = sessions[i]
            messages = list(s.messages)
            for t, max_tokens in enumerate(s.max_tokens):
                rec = Turn(session=i, turn=t, max_tokens=max_tokens, submitted_s=0.0)
                turns.append(rec)
                answer = await _run_turn(engine, messages, rec, t0)
                if answer is None:
                    break
                if t + 1 < s.turns:
                    followup = {"role": "user", "content": s.followups[t]}
                    messages = [*messages, {"role": "assistant", "content": _clean(answer)}, followup]

    with anyio.move_on_after(max_run_s) as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, len(sessions))):
                tg.start_soon(client)
    wall = time.perf_counter() - t0
    kv_freed = await wait_free(engine)
    after = engine.stats()
    turns.sort(key=lambda t: (t.session, t.turn))
    return Run(
        workload=workload,
        concurrency=concurrency,
        system=system,
        repeat=repeat,
        wall_s=wall,
        cut_short=scope.cancelled_caught,
        kv_freed=kv_freed,
        turns=turns,
        steps={m: after[m].steps - before[m].steps for m in after},
        prefix_cache_hit_tokens={
            m: after[m].prefix_cache_hit_tokens - before[m].prefix_cache_hit_tokens for m in after
        },
    )


# ---- engines --------------------------------------------------------------------------------------
def release_memory() -> None:
    """Give a closed engine's memory back before the next one loads (two copies of a real pair
    do not fit on a small machine): collect cycles, and return freed heap to the OS (glibc)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


async def open_engine(cfg: BenchConfig, system: str, kv_cache_tokens: int) -> Engine:
    """A started engine for one system, after a warm-up request."""
    s, policy = SYSTEMS.get(system, SYSTEMS["routed"]), cfg.other_policies.get(system, cfg.policy)
    specs = {
        m: ModelSpec(
            path=cfg.models[m],
            kv_cache_tokens=kv_cache_tokens,
            enable_prefix_caching=s.prefix_caching,
            device=cfg.device,
            dtype=cfg.dtype,
            **({} if cfg.cuda_graph_max_batch is None else {"cuda_graph_max_batch": cfg.cuda_graph_max_batch}),
            **cfg.model_options.get(m, {}),
        )
        for m in policy.models
    }
    threads = (cfg.threads_lockstep or usable_cores()) if s.mode == "lockstep" else cfg.threads
    specs, policy = s.serves(policy, specs)
    engine = Engine(models=specs, policy=policy, mode=s.mode, num_threads=threads)
    await engine.start()
    try:
        warm = await engine.generate(
            WARMUP_PROMPT, SamplingParams(temperature=0, max_tokens=cfg.warmup_tokens, ignore_eos=True)
        )
        if warm.finish_reason not in ("stop", "length"):
            raise BenchError(f"{system}: the warm-up request failed: {warm.error}")
        if not await wait_free(engine):
            raise BenchError(f"{system}: the warm-up request's KV was not freed")
    except BaseException:
        await engine.close()
        raise
    return engine


# ---- the whole benchmark ----------------------------------------------------------------------------
def _outputs_agree(ref: dict, other: dict) -> tuple[int, int]:
    """(differing, compared) over the turns both completed."""
    common = sorted(set(ref) & set(other))
    return sum(ref[k] != other[k] for k in common), len(common)


def _compare(summaries: list[Summary], runs: list[Run]) -> list[str]:
    """Set `same_tokens_as_routed` on every summary of the policy's serving architectures (routed,
    standard, lockstep); a warning per difference."""
    warnings = []
    by_key: dict[tuple, list[Run]] = {}
    for r in runs:
        by_key.setdefault((r.workload, r.concurrency, r.system), []).append(r)
    for s in summaries:
        ref_runs = by_key.get((s.workload, s.concurrency, "routed"))
        if not ref_runs or s.system not in SYSTEMS or SYSTEMS[s.system].alone is not None:
            # one model alone, or another policy, writes other tokens
            continue
        ref = ref_runs[0].outputs()
        differing = compared = 0
        for r in by_key[(s.workload, s.concurrency, s.system)]:
            d, n = _outputs_agree(ref, r.outputs())
            differing, compared = differing + d, compared + n
        if compared == 0:
            continue
        s.same_tokens_as_routed = differing == 0
        if differing:
            warnings.append(
                f"{s.workload} C={s.concurrency} {s.system}: greedy tokens differ from routed's on {differing} of "
                f"{compared} requests compared (float32 near-ties can flip a token when batches differ)"
            )
    return warnings


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
    limit = min(loaded.max_model_len for loaded in engine.loaded.values())
    for (w, _), sessions in plan.items():
        n = max(s.context_tokens() for s in sessions)
        if n > limit:
            raise BenchError(
                f"workload {w!r} needs up to {n} tokens of context, but the models hold {limit} "
                "(lower --max-tokens / --history-tokens / --turns)"
            )


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
    cfg: BenchConfig, tokenizer, *, command: str = "", progress: Callable[[str], None] | None = None
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
    models = ", ".join(f"{m}={Path(p).name}" for m, p in cfg.models.items())
    say(
        f"bench: {len(jobs)} runs: {', '.join(w.name for w in cfg.workloads)} x C {' '.join(map(str, cfg.concurrency))}"
        f" x {', '.join(cfg.systems)} x {cfg.repeats}; {models}; {cfg.policy!r}; KV {kv} tokens per model"
    )
    runs: list[Run] = []
    profiles: dict[str, dict] = {}
    engine: Engine | None = None
    engine_system = None
    checked = False
    try:
        for i, (w, c, system, repeat) in enumerate(jobs):
            if engine is not None and not (cfg.reuse_engines and engine_system == system):
                await engine.close()
                engine = None
                release_memory()
            if engine is None:
                engine, engine_system = await open_engine(cfg, system, kv), system
                if engine.profiles:  # k="auto" or delayed_batching="auto" planned with these
                    profiles.setdefault(system, {m: p.to_json() for m, p in engine.profiles.items()})
                if not checked:
                    _check_context(engine, cfg, plan)
                    checked = True
            if cfg.reuse_engines:
                await engine.reset_prefix_cache()  # cold, as a fresh engine would be
            run = await measure(
                engine, plan[(w.name, c)], c, max_run_s=cfg.max_run_s, workload=w.name, system=system, repeat=repeat
            )
            runs.append(run)
            say(f"[{i + 1}/{len(jobs)}] {_line(run, list(cfg.models))}")
            failed = next((t for t in run.turns if t.error is not None), None)
            if failed is not None:
                raise BenchError(
                    f"{w.name} C={c} {system}: session {failed.session} turn {failed.turn} failed: {failed.error}"
                )
    finally:
        if engine is not None:
            await engine.close()
            release_memory()
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.concurrency, r.system), []).append(r)
    order = [(w.name, c, s) for w in cfg.workloads for c in cfg.concurrency for s in cfg.systems]
    summaries = [Summary.of(groups[key]) for key in order if key in groups]
    warnings = _compare(summaries, runs)
    warnings += [
        f"{r.workload} C={r.concurrency} {r.system} #{r.repeat + 1}: KV blocks were still held after the run"
        for r in runs
        if not r.kv_freed
    ]
    workloads = {}
    for w in cfg.workloads:
        levels = {}
        for c in cfg.concurrency:
            sessions = plan[(w.name, c)]
            tokens = [s.prompt_tokens for s in sessions]
            levels[str(c)] = {
                "sessions": len(sessions),
                "turns": sum(s.turns for s in sessions),
                "output_tokens": sum(sum(s.max_tokens) for s in sessions),
                "prompt_tokens_min": min(tokens),
                "prompt_tokens_max": max(tokens),
            }
        workloads[w.name] = {"description": w.describe(), "sizes": w.sizes_dict(), "levels": levels}
    settings = {
        "systems": cfg.systems,
        "concurrency": cfg.concurrency,
        "repeats": cfg.repeats,
        "requests": cfg.requests,
        "min_requests": cfg.min_requests,
        "kv_cache_tokens": kv,
        "threads": cfg.threads,
        "threads_lockstep": cfg.threads_lockstep,
        "max_run_s": cfg.max_run_s,
        "reuse_engines": cfg.reuse_engines,
        "other_policies": {name: repr(p) for name, p in cfg.other_policies.items()},
        "seed": cfg.seed,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "warmup_tokens": cfg.warmup_tokens,
        "cuda_graph_max_batch": cfg.cuda_graph_max_batch,
        "model_options": cfg.model_options,
    }
    return BenchResult(
        command=command,
        models={m: str(p) for m, p in cfg.models.items()},
        policy=repr(cfg.policy),
        machine=machine_info(),
        settings=settings,
        workloads=workloads,
        runs=runs,
        summaries=summaries,
        warnings=warnings,
        wall_s=time.perf_counter() - t_start,
        profiles=profiles,
    )
