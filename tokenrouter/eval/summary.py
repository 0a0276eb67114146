"""The numbers results.md and pareto.png show, computed once from results.jsonl's records, so
that the table and the figure cannot disagree. Per system, over the problems it finished:

- pass@1: greedy, one answer per problem, the share whose program passed `check` in the sandbox;
- the share of output tokens each model wrote;
- tokens processed per model (what its forwards took in: prompt, catch-ups, recomputation) and
  engine steps per model, each per problem;
- hand-offs per problem;
- relative cost: sum over problems and models of tokens processed x the model's FLOPs per token,
  over the same sum for the largest model alone on the same problems (1.0 is large alone);
- quality s/problem: the quality phase's wall time per problem (planning only: it shares the CPU
  with the sandbox and whatever else ran);
- output tok/s and p50 latency: the speed phase (closed loop at C in flight, see runner.py), the
  median over its runs at the latest setting (C, requests), with their range when there are
  several.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .results import header


@dataclass
class Speed:
    """A system's speed-phase runs at one setting (C in flight over the first N problems)."""

    concurrency: int
    requests: int
    runs: list[dict]

    @property
    def tok_per_s(self) -> float:
        return statistics.median(r["tok_per_s"] for r in self.runs)

    @property
    def p50_s(self) -> float:
        return statistics.median(r["p50_s"] for r in self.runs)

    def cell(self) -> str:
        """Median output tok/s, and the range over the runs when there are several."""
        if len(self.runs) == 1:
            return f"{self.tok_per_s:.2f}"
        rates = [r["tok_per_s"] for r in self.runs]
        return f"{self.tok_per_s:.2f} ({min(rates):.1f}-{max(rates):.1f})"


@dataclass
class Row:
    system: str
    n: int = 0
    passed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    tokens_processed: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    handoffs: int = 0
    capped: int = 0  # answers cut at max_tokens
    wall_s: float = 0.0
    wall_problems: int = 0
    relative_cost: float | None = None
    cost_problems: int = 0  # problems the relative cost is over (shared with the reference)
    speed_runs: list[dict] = field(default_factory=list)  # every speed record, in file order
    policy: str = ""
    dtype: dict[str, str] = field(default_factory=dict)
    linear_kernel: dict[str, str] = field(default_factory=dict)  # per model, as LoadedModel states it

    @property
    def pass_at_1(self) -> float | None:
        return self.passed / self.n if self.n else None

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens_by_model.values())

    def share(self, model: str) -> float | None:
        return self.tokens_by_model.get(model, 0) / self.output_tokens if self.output_tokens else None

    @property
    def speed(self) -> Speed | None:
        """The runs at the setting of the latest one (an older setting's runs are not the same work)."""
        if not self.speed_runs:
            return None
        last = self.speed_runs[-1]
        c, n = last["concurrency"], last["requests"]
        return Speed(c, n, [r for r in self.speed_runs if (r["concurrency"], r["requests"]) == (c, n)])


@dataclass
class Summary:
    run: dict
    rows: list[Row]
    reference: str | None  # the system costs are relative to
    models: list[str]

    def plotted(self) -> list[Row]:
        """The systems pareto.png shows: those that finished as many problems as the most
        finished one. A system still running has its pass@1 over the problems done so far, the
        first ones of the file, which are not the same work as everyone else's."""
        most = max((r.n for r in self.rows), default=0)
        return [r for r in self.rows if r.n and r.n == most]


def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def _cost(problem: dict, flops: dict[str, int]) -> float:
    return sum(n * flops.get(m, 0) for m, n in problem["tokens_processed"].items())


def summarize(records: list[dict]) -> Summary:
    run = header(records)
    if run is None:
        raise ValueError("not an eval results file: the first record is not a run record")
    models = list(run["models"])
    flops = {m: info["flops_per_token"] for m, info in run["models"].items()}
    rows: dict[str, Row] = {}
    problems: dict[str, dict[str, dict]] = {}  # system -> task_id -> record (the last wins)
    singles: dict[str, str] = {}  # system -> its one model
    for r in records:
        t = r.get("type")
        if t in ("system", "problem", "segment", "speed"):
            row = rows.setdefault(r["system"], Row(r["system"]))
        if t == "system":
            row.policy, row.dtype = r["policy"], r.get("dtype", {})
            row.linear_kernel = r.get("linear_kernel", {})
            if r["kind"] in ("small", "large", "single"):
                singles[r["system"]] = r["models"][0]
        elif t == "problem":
            problems.setdefault(r["system"], {})[r["task_id"]] = r
        elif t == "segment":
            row.wall_s += r["wall_s"]
            row.wall_problems += r["problems"]
        elif t == "speed":
            row.speed_runs.append(r)
    for name, row in rows.items():
        for p in problems.get(name, {}).values():
            row.n += 1
            row.passed += bool(p["passed"])
            row.statuses[p["status"]] = row.statuses.get(p["status"], 0) + 1
            _add(row.tokens_by_model, p["tokens_by_model"])
            _add(row.tokens_processed, p["tokens_processed"])
            _add(row.steps, p["steps_delta"])
            row.handoffs += p["handoffs"]
            row.capped += p.get("finish_reason") == "length"
    # The reference: the largest model (by FLOPs per token) alone, if it ran.
    largest = max(models, key=lambda m: flops[m])
    reference = next((s for s, m in singles.items() if m == largest and problems.get(s)), None)
    if reference is not None:
        ref = problems[reference]
        for name, row in rows.items():
            mine = problems.get(name, {})
            common = sorted(set(mine) & set(ref))
            base = sum(_cost(ref[t], flops) for t in common)
            if common and base > 0:
                row.relative_cost = sum(_cost(mine[t], flops) for t in common) / base
                row.cost_problems = len(common)
    return Summary(run, list(rows.values()), reference, models)


__all__ = ["Row", "Speed", "Summary", "summarize"]
