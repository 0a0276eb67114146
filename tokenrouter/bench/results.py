"""What a whole benchmark produced: every run, the medians per (workload, C, system), and what
they came from (the workloads as built, the settings, the machine), so results.json stands alone.

Greedy outputs are compared across systems here: the same tokens, or a warning (float32
near-ties can flip a token when batches differ).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .machine import machine_info
from .metrics import Run, Summary
from .sessions import Session
from .settings import BenchConfig
from .systems import SYSTEMS


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


def collect(
    cfg: BenchConfig,
    plan: dict[tuple[str, int], list[Session]],
    runs: list[Run],
    *,
    kv_cache_tokens: int,
    profiles: dict[str, dict],
    command: str,
    started: float,
) -> BenchResult:
    """The result of a whole benchmark from its runs: medians in the configured order, the outputs
    compared, and the workloads as built; `started` is the benchmark's start (`time.perf_counter()`)."""
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
        "kv_cache_tokens": kv_cache_tokens,
        "threads": cfg.threads,
        "threads_lockstep": cfg.threads_lockstep,
        "max_run_s": cfg.max_run_s,
        "reuse_engines": cfg.reuse_engines,
        "order": cfg.order,
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
        wall_s=time.perf_counter() - started,
        profiles=profiles,
    )
