"""What one measured run records, and the medians over repeats that the tables show.

Times are as the client sees them: from just before `engine.stream` is called (prompt encoding
included) to the first streamed token (TTFT) and to the last delta (latency). Throughput counts
every generated token, including those of requests still in flight when a run is cut short, over
the run's wall time; so does TTFT (every request that got a first token). Latency and hand-offs
are of the requests that completed.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no data."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


@dataclass
class Turn:
    """One request (one turn of a session) as the client saw it."""

    session: int
    turn: int
    max_tokens: int
    submitted_s: float  # since the run started
    ttft_s: float | None = None
    latency_s: float | None = None  # None until it completed
    tokens: int = 0  # streamed so far
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    handoffs: int = 0
    tokens_processed: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    token_ids: list[int] = field(default_factory=list, repr=False)

    @property
    def completed(self) -> bool:
        return self.latency_s is not None and self.error is None


@dataclass
class Run:
    """One measured run: a workload at concurrency C on one system."""

    workload: str
    concurrency: int
    system: str
    repeat: int
    wall_s: float
    cut_short: bool  # the --max-run-s cap ended it; in-flight requests were cancelled
    kv_freed: bool  # every worker's KV pool was whole again after the run
    turns: list[Turn] = field(repr=False)
    steps: dict[str, int] = field(default_factory=dict)  # per model, during the run
    prefix_cache_hit_tokens: dict[str, int] = field(default_factory=dict)
    # per model, during the run: tokens it proposed itself and checked (prompt lookup), and accepted
    proposed_tokens: dict[str, int] = field(default_factory=dict)
    proposed_accepted: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> list[Turn]:
        return [t for t in self.turns if t.completed]

    @property
    def output_tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    def metrics(self) -> dict:
        done = self.done
        latencies = [t.latency_s for t in done]
        ttfts = [t.ttft_s for t in self.turns if t.ttft_s is not None]  # a request cut short had its first token too
        by_model: dict[str, int] = {}
        processed: dict[str, int] = {}
        for t in self.turns:
            _add(by_model, t.tokens_by_model)
            _add(processed, t.tokens_processed)
        return {
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "tok_per_s": self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "p50_s": percentile(latencies, 0.5),
            "p99_s": percentile(latencies, 0.99),
            "ttft_p50_s": percentile(ttfts, 0.5),
            "ttft_p99_s": percentile(ttfts, 0.99),
            "tokens_by_model": by_model,
            "handoffs": sum(t.handoffs for t in self.turns),
            "tokens_processed": processed,
            "requests_completed": len(done),
            "requests_total": len(self.turns),
        }

    def outputs(self) -> dict[tuple[int, int], list[int]]:
        """Greedy tokens of every completed turn, by (session, turn): to compare systems."""
        return {(t.session, t.turn): t.token_ids for t in self.done}

    def to_dict(self) -> dict:
        turns = [{k: v for k, v in asdict(t).items() if k != "token_ids"} for t in self.turns]
        return {
            "workload": self.workload,
            "concurrency": self.concurrency,
            "system": self.system,
            "repeat": self.repeat,
            "cut_short": self.cut_short,
            "kv_freed": self.kv_freed,
            **self.metrics(),
            "steps": self.steps,
            "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
            "proposed_tokens": self.proposed_tokens,
            "proposed_accepted": self.proposed_accepted,
            "turns": turns,
        }


@dataclass
class Summary:
    """The medians over the repeats of one (workload, C, system): what a table row shows."""

    workload: str
    concurrency: int
    system: str
    repeats: int
    metrics: dict
    cut_short: bool  # any repeat was cut short
    same_tokens_as_routed: bool | None = None  # None: routed did not run, or nothing to compare

    @classmethod
    def of(cls, runs: list[Run]) -> Summary:
        first = runs[0]
        per_run = [r.metrics() for r in runs]
        return cls(
            first.workload,
            first.concurrency,
            first.system,
            len(runs),
            median_metrics(per_run),
            any(r.cut_short for r in runs),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def median_metrics(per_run: list[dict]) -> dict:
    """The median of each number over runs (per key for dicts); None where every run has None."""
    out = {}
    for key, first in per_run[0].items():
        if isinstance(first, dict):
            keys = sorted({k for m in per_run for k in m[key]})
            out[key] = {k: statistics.median(m[key].get(k, 0) for m in per_run) for k in keys}
        else:
            values = [m[key] for m in per_run if m[key] is not None]
            out[key] = statistics.median(values) if values else None
    return out
