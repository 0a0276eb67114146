"""Run every system on the same problems: a quality phase, then a speed phase, per system.

For each system, one engine (its models only) is started and warmed up, then:

- **quality**: greedy pass@1. Every problem not yet in results.jsonl for this system is sent,
  `concurrency` at a time; as each answer ends its program is tested in the sandbox and the
  record appended (flushed) at once. An interrupted run loses only the problems in flight, and
  `resume=True` carries on where it stopped. Its wall time depends on whatever else shares the
  machine, so it is not the speed measurement.
- **speed**: a closed loop on the warmed engine (prefix cache emptied first) keeping C requests
  in flight over a fixed set of problems (the first N of the problems file, N = 2 x C by default,
  whatever --limit says, so every system and every run measures the same work), with the
  quality phase's prompt and stop string. Output tokens/s = all output tokens / wall time;
  latency per request from submission to its end. Recorded with the date, the machine and its
  1-minute load average before and after (other work on the machine shows there).

The speed phase runs `speed_rounds` times per system, interleaved: the first round right after
each system's quality phase, then round after round over the systems, each loaded again, so a
slow spell of the machine falls on every system alike rather than on one (the report takes the
median). Rounds already recorded at the same C and N count, unless asked to measure again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from ..api import Engine, spec_in_precision
from ..bench import machine_info, percentile, release_memory, wait_free
from ..config import SamplingParams
from ..errors import ConfigError, TokenRouterError
from ..files import sha256_file
from .data import Problem
from .flops import describe, flops_per_token, parameter_counts
from .prompt import PROMPT_VERSION, STOP, build_program, prompt_ids
from .results import FORMAT, RESULTS, ResultsFile, check_resumable, done_keys, header, model_fingerprint, portable
from .sandbox import run_program
from .sandbox_limits import Limits
from .settings import EvalSettings
from .systems import System

try:
    from builtins import BaseExceptionGroup
except ImportError:  # Python 3.10: anyio's backport
    from exceptiongroup import BaseExceptionGroup

WARMUP_PROMPT = "Hello! Who are you?"  # plain text, like tokenrouter bench's: nothing of it stays cached


class EvalError(TokenRouterError):
    """An evaluation that cannot go on (a request failed in the engine, a results file that does
    not fit); what was recorded so far stays valid."""


@dataclass
class EvalPlan:
    """Everything one run needs; `problems` are those of the quality phase, `speed_problems` the
    fixed set of the speed phase."""

    systems: list[System]
    models: dict[str, Path]
    problems: list[Problem]
    speed_problems: list[Problem]
    data: dict  # {"source", "fingerprint", "problems"}
    settings: EvalSettings
    out_dir: Path
    resume: bool = False
    command: str = ""
    model_info: dict[str, dict] = field(default_factory=dict)  # filled by `run_record`

    @property
    def results(self) -> ResultsFile:
        return ResultsFile(self.out_dir / RESULTS)

    def limits(self) -> Limits:
        return Limits(timeout_s=self.settings.timeout_s, memory_bytes=self.settings.memory_mb << 20)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_record(plan: EvalPlan) -> dict:
    """The "run" record: what every number in the file depends on."""
    models = {}
    for name, path in plan.models.items():
        counts = parameter_counts(path)
        models[name] = {
            "path": portable(path),
            "fingerprint": model_fingerprint(path),
            "flops_per_token": flops_per_token(path),
            "parameters": counts["total"],
            "embedding_parameters": counts["embedding"],
            "description": describe(path),
        }
    limits = plan.limits()
    return {
        "type": "run",
        "format": FORMAT,
        "prompt_version": PROMPT_VERSION,
        "max_tokens": plan.settings.max_tokens,
        "precision": plan.settings.precision,
        "models": models,
        "data": plan.data,
        "sandbox": {"timeout_s": limits.timeout_s, "memory_bytes": limits.memory_bytes},
        "created": _now(),
        "command": portable(plan.command),
    }


def prepare(plan: EvalPlan) -> list[dict]:
    """Start results.jsonl, or check that it may be resumed; the records already there."""
    rf = plan.results
    new = run_record(plan)
    if not rf.exists():
        rf.append(new)
        return [new]
    records = rf.read()
    old = header(records)
    if old is None:
        raise EvalError(f"{rf.path} does not start with a run record; it is not an eval results file")
    if not plan.resume:
        raise EvalError(f"{rf.path} already holds results: pass --resume to continue that run, or choose another --out")
    check_resumable(rf.path, old, new)
    return records


def _system_record(system: System, engine: Engine, plan: EvalPlan) -> dict:
    router_sha = None
    if system.router is not None:
        weights = Path(system.router) / "router.safetensors"
        router_sha = sha256_file(weights)[:16] if weights.is_file() else None
    info = engine.info()
    return {
        "type": "system",
        "system": system.label,
        "spec": system.spec,
        "kind": system.kind,
        "policy": repr(info.policy),
        "models": list(system.models),
        "value": system.value,
        "router": system.router,
        "router_fingerprint": router_sha,
        "dtype": {m: str(info.models[m].dtype).removeprefix("torch.") for m in system.models},
        "precision": {m: info.models[m].precision for m in system.models},
        "linear_kernel": {m: info.models[m].linear_kernel for m in system.models},
        "device": plan.settings.device,
        "date": _now(),
    }


def _check_same_router(records: list[dict], rec: dict) -> None:
    for r in records:
        if (
            r.get("type") == "system"
            and r["system"] == rec["system"]
            and r.get("router_fingerprint") != rec["router_fingerprint"]
        ):
            raise EvalError(
                f"system {rec['system']!r}: its router ({rec['router']}) is not the one its earlier results used "
                f"({r.get('router')}); give it another label (LABEL=SPEC) or write to another --out"
            )


@contextlib.asynccontextmanager
async def _first_error():
    """One failed request cancels the others: raise its error, not a group of cancellations."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        first = next((e for e in leaves if isinstance(e, TokenRouterError)), None) or next(
            (e for e in leaves if not isinstance(e, anyio.get_cancelled_exc_class())), leaves[0]
        )
        raise first from None


def _leaves(group):
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e


def _steps(engine: Engine) -> dict[str, int]:
    return {m: s.steps for m, s in engine.stats().items()}


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a[k] - b.get(k, 0) for k in a}


@contextlib.asynccontextmanager
async def _loaded(system: System, plan: EvalPlan):
    """The system's engine, started and warmed up; closed and its memory given back after."""
    kv = plan.settings.kv_tokens()
    settings = plan.settings
    specs = {
        m: spec_in_precision(plan.models[m], settings.precision, kv_cache_tokens=kv, device=settings.device)
        for m in system.models
    }
    engine = Engine(models=specs, policy=system.make(), num_threads=plan.settings.threads)
    await engine.start()
    try:
        warm = await engine.generate(WARMUP_PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        if warm.finish_reason not in ("stop", "length"):
            raise EvalError(f"{system.label}: the warm-up request failed: {warm.error}")
        await wait_free(engine)
        await engine.reset_prefix_cache()
        yield engine
    finally:
        await engine.close()
        del engine
        release_memory()


def _params(plan: EvalPlan) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=plan.settings.max_tokens, stop=STOP)


async def _generate(engine: Engine, system: System, problem: Problem, ids: list[int], params: SamplingParams):
    out = await engine.generate(ids, params)
    if out.finish_reason not in ("stop", "length"):
        raise EvalError(f"{system.label} {problem.task_id}: the request ended with {out.finish_reason}: {out.error}")
    return out


async def quality_phase(
    engine: Engine, system: System, todo: Sequence[Problem], plan: EvalPlan, say: Callable[[str], None]
) -> None:
    """Answer and test every problem of `todo`, appending a record as each ends."""
    tokenizer = engine.info().tokenizer
    params, limits, rf = _params(plan), plan.limits(), plan.results
    in_flight = anyio.CapacityLimiter(plan.settings.concurrency)
    testing = anyio.CapacityLimiter(plan.settings.sandbox_workers)
    last = _steps(engine)
    passed = done = 0
    t0 = time.perf_counter()

    async def one(problem: Problem) -> None:
        nonlocal last, passed, done
        ids = prompt_ids(tokenizer, problem)
        async with in_flight:
            out = await _generate(engine, system, problem, ids, params)
        program = build_program(problem, out.text)
        outcome = await anyio.to_thread.run_sync(run_program, program.code, limits, limiter=testing)
        now = _steps(engine)
        record = {
            "type": "problem",
            "system": system.label,
            "task_id": problem.task_id,
            "passed": outcome.passed,
            "status": outcome.status,
            "error": outcome.error,
            "completion": out.text,
            "mode": program.mode,
            "finish_reason": out.finish_reason,
            "prompt_tokens": len(ids),
            "output_tokens": len(out.token_ids),
            "tokens_by_model": out.tokens_per_model(),
            "tokens_processed": dict(out.tokens_processed),
            "handoffs": out.num_handoffs,
            "latency_s": round(out.latency, 3),
            "test_s": round(outcome.duration_s, 3),
            "steps_delta": _minus(now, last),
            "date": _now(),
        }
        last = now
        rf.append(record)
        done += 1
        passed += outcome.passed
        shares = " ".join(f"{m} {n}" for m, n in record["tokens_by_model"].items())
        say(
            f"[{system.label}] {problem.task_id}: {outcome.status}"
            f"{' (' + outcome.error[:60] + ')' if outcome.error else ''}"
            f", {len(out.token_ids)} tokens ({shares}), {out.latency:.1f} s; {done}/{len(todo)} done, {passed} passed"
        )

    async with _first_error(), anyio.create_task_group() as tg:
        for p in todo:
            tg.start_soon(one, p)
    wall = time.perf_counter() - t0
    rf.append(
        {
            "type": "segment",
            "system": system.label,
            "problems": len(todo),
            "wall_s": round(wall, 2),
            "concurrency": plan.settings.concurrency,
            "date": _now(),
        }
    )
    say(
        f"[{system.label}] quality: {passed}/{len(todo)} passed in {wall:.0f} s "
        f"({wall / max(1, len(todo)):.1f} s per problem)"
    )


async def speed_phase(engine: Engine, system: System, plan: EvalPlan, say: Callable[[str], None]) -> dict:
    """A closed loop keeping C requests in flight over the fixed speed set; its record."""
    tokenizer = engine.info().tokenizer
    problems = plan.speed_problems
    prompts = [prompt_ids(tokenizer, p) for p in problems]
    params, c = _params(plan), plan.settings.concurrency
    await wait_free(engine)
    await engine.reset_prefix_cache()  # cold, as for every system
    latencies: list[float] = []
    tokens = 0
    by_model: dict[str, int] = {}
    processed: dict[str, int] = {}
    handoffs = 0
    queue = iter(range(len(prompts)))
    before = _steps(engine)
    load_before = os.getloadavg()[0]  # other work on the machine shows here
    t0 = time.perf_counter()

    async def client() -> None:
        nonlocal tokens, handoffs
        for i in queue:  # the shared iterator hands each request to one client
            start = time.perf_counter()
            out = await _generate(engine, system, problems[i], prompts[i], params)
            latencies.append(time.perf_counter() - start)
            tokens += len(out.token_ids)
            handoffs += out.num_handoffs
            for m, n in out.tokens_per_model().items():
                by_model[m] = by_model.get(m, 0) + n
            for m, n in out.tokens_processed.items():
                processed[m] = processed.get(m, 0) + n

    async with _first_error(), anyio.create_task_group() as tg:
        for _ in range(min(c, len(prompts))):
            tg.start_soon(client)
    wall = time.perf_counter() - t0
    record = {
        "type": "speed",
        "system": system.label,
        "concurrency": c,
        "requests": len(prompts),
        "problems": [p.task_id for p in problems],
        "wall_s": round(wall, 3),
        "output_tokens": tokens,
        "tok_per_s": tokens / wall if wall > 0 else 0.0,
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
        "tokens_by_model": by_model,
        "tokens_processed": processed,
        "handoffs": handoffs,
        "steps": _minus(_steps(engine), before),
        "date": _now(),
        "machine": machine_info(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    plan.results.append(record)
    say(
        f"[{system.label}] speed: {record['tok_per_s']:.2f} output tok/s, p50 {record['p50_s']:.1f} s at C={c} "
        f"over {len(prompts)} requests ({wall:.0f} s)"
    )
    return record


def _speed_runs(records: list[dict], system: System, plan: EvalPlan) -> int:
    """Speed-phase runs of this system already recorded at this C and N."""
    n = len(plan.speed_problems)
    return sum(
        r.get("type") == "speed"
        and r["system"] == system.label
        and r["concurrency"] == plan.settings.concurrency
        and r["requests"] == n
        for r in records
    )


def _rounds_owed(records: list[dict], plan: EvalPlan) -> dict[str, int]:
    rounds = plan.settings.speed_rounds if plan.speed_problems else 0
    if plan.settings.remeasure_speed:
        return {s.label: rounds for s in plan.systems}
    return {s.label: max(0, rounds - _speed_runs(records, s, plan)) for s in plan.systems}


async def run_eval(plan: EvalPlan, say: Callable[[str], None] = lambda _: None) -> Path:
    """Run (or resume) the plan; returns the results file. Report with `report.write_report`."""
    if not plan.problems:
        raise ConfigError("problems: none selected")
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    records = prepare(plan)
    done = done_keys(records)
    owed = _rounds_owed(records, plan)
    for i, system in enumerate(plan.systems):
        todo = [p for p in plan.problems if (system.label, p.task_id) not in done]
        measure = owed[system.label] > 0
        head = f"[{i + 1}/{len(plan.systems)}] {system.label}"
        if not todo and not measure:
            speed = "speed measured" if plan.speed_problems else "no speed phase asked"
            say(f"{head}: every problem done, {speed}; skipped")
            continue
        skipped = len(plan.problems) - len(todo)
        say(
            f"{head}: {len(todo)} problem(s) to run{f' ({skipped} already done)' if skipped else ''}"
            f"{', then the speed phase' if measure else ''}; loading {', '.join(system.models)}"
        )
        t0 = time.perf_counter()
        async with _loaded(system, plan) as engine:
            rec = _system_record(system, engine, plan)
            _check_same_router(records, rec)
            plan.results.append(rec)
            say(f"{head}: {rec['policy']} ready in {time.perf_counter() - t0:.0f} s")
            if todo:
                await quality_phase(engine, system, todo, plan, say)
            if measure:
                await speed_phase(engine, system, plan, say)
                owed[system.label] -= 1
    while any(owed.values()):  # one more round over the systems that still owe runs
        for system in plan.systems:
            if owed[system.label]:
                say(f"[speed] {system.label}: {owed[system.label]} run(s) to go; loading {', '.join(system.models)}")
                async with _loaded(system, plan) as engine:
                    await speed_phase(engine, system, plan, say)
                owed[system.label] -= 1
    return plan.results.path
