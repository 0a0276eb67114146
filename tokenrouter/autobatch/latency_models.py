"""Step-latency models: how long a step of a model takes, as the throughput model reads it.

`TableLatency` is what the engine measures and uses (seconds against the tokens in a step, from
the profile, autobatch/latency_profile.py); `LatencyModel` (a line) is kept as a summary;
`VerifyLatency` is a verifier's check step, which `Speculative(k="auto")` plans with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .markov import binomial_pmf


@dataclass(frozen=True)
class LatencyModel:
    """A model's step latency in seconds: a + s * b + k * c for b requests and c catch-up tokens."""

    a: float
    s: float = 0.0
    k: float = 0.0

    def __post_init__(self):
        for name in ("a", "s", "k"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"LatencyModel.{name}: must be a finite number >= 0, got {v!r}")
        if self.a + self.s <= 0:
            raise ValueError("LatencyModel: a step must take time (a + s > 0)")

    def __call__(self, b, c=0.0):
        return self.a + self.s * b + self.k * c

    def expected(self, b, h: float, u: float):
        """Mean latency of a step of b rows when each is a returning request with probability h,
        with u catch-up tokens (linear, so the mean catch-up is enough)."""
        return self(b, h * u * np.asarray(b, dtype=float))


@dataclass(frozen=True)
class TableLatency:
    """A model's step latency as measured: seconds against the tokens in the step, linear between
    the measured points (and beyond the last, along the last segment), times `scale`.

    Why not a line: on a CPU a one-token step is a matrix-vector product and costs about half of a
    two-token one, and a GPU step is flat until the batch fills the device; a line through all the
    points misses both. `scale` is what online calibration adjusts (the other model's steps, longer
    contexts and the work around the forward all make real steps slower than the profile's)."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    scale: float = 1.0

    def __post_init__(self):
        t, y = self.tokens, self.seconds
        if not t or len(t) != len(y):
            raise ValueError("TableLatency: tokens and seconds must be non-empty and of equal length")
        if any(not (math.isfinite(v) and v >= 1) for v in t) or any(b <= a for a, b in zip(t, t[1:])):
            raise ValueError(f"TableLatency.tokens: must be increasing numbers >= 1, got {t!r}")
        if any(not (math.isfinite(v) and v > 0) for v in y):
            raise ValueError(f"TableLatency.seconds: must be finite and > 0, got {y!r}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"TableLatency.scale: must be finite and > 0, got {self.scale!r}")

    @classmethod
    def from_points(cls, points, scale: float = 1.0) -> TableLatency:
        """From (tokens, seconds) pairs in any order: repeated token counts are averaged, and the
        curve is made non-decreasing (pool-adjacent-violators), since more tokens never cost less."""
        by: dict[float, list[float]] = {}
        for n, sec in points:
            by.setdefault(float(n), []).append(float(sec))
        tokens = sorted(by)
        blocks: list[list[float]] = []  # [sum, count, width] of pooled runs
        for n in tokens:
            blocks.append([sum(by[n]) / len(by[n]), 1.0, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                s, c, w = blocks.pop()
                blocks[-1][0] += s
                blocks[-1][1] += c
                blocks[-1][2] += w
        seconds = [s / c for s, c, w in blocks for _ in range(w)]
        return cls(tuple(tokens), tuple(seconds), scale)

    def with_scale(self, scale: float) -> TableLatency:
        return TableLatency(self.tokens, self.seconds, scale)

    def at(self, n):
        """Unscaled seconds for n tokens in a step (elementwise)."""
        n = np.asarray(n, dtype=float)
        t, y = np.asarray(self.tokens), np.asarray(self.seconds)
        out = np.interp(n, t, y)
        if len(t) > 1:
            slope = max(0.0, (y[-1] - y[-2]) / (t[-1] - t[-2]))
            out = np.where(n > t[-1], y[-1] + slope * (n - t[-1]), out)
        return out

    def __call__(self, b, c=0.0):
        return self.scale * self.at(np.asarray(b, dtype=float) + c)

    def expected(self, b, h: float, u: float):
        """Mean latency of a step of b rows of which x ~ Bin(b, h) are returning requests with u
        tokens each (the curve is not linear, so the mix matters, not just the mean)."""
        b = np.asarray(b, dtype=int)
        out = np.zeros(b.shape, dtype=float)
        for v in np.unique(b):
            x = np.arange(v + 1)
            out[b == v] = self.scale * float(binomial_pmf(int(v), h) @ self.at(v + x * max(u - 1.0, 0.0)))
        return out if out.ndim else float(out)


@dataclass(frozen=True)
class VerifyLatency:
    """A verifier's step latency for b rows of t new tokens each, with logits at every position
    (a speculative check: k drafts and the position before them), as measured: for each measured
    t a curve over b (a TableLatency whose "tokens" are rows), linear in t between them, and
    t = 1 the model's decode rows. Why not the decode table at b * t tokens: a check's rows keep
    logits at every position (the vocabulary projection runs b * t times, not b) and attend over
    their new tokens. On the 1.5B demo model a step of 16 rows of 3 took 2.3 decode steps of 16
    while each extend row had its own attention call, where the table said 1.6; with short
    extend rows batched it took 1.75 s against the table's 1.70 (benchmarks/results/speculative-checks/README.md)."""

    decode: TableLatency  # the model's step table (seconds against tokens in a step)
    rows: tuple[tuple[int, TableLatency], ...] = ()  # (t, seconds against b), t >= 2, increasing

    def __post_init__(self):
        ts = [t for t, _ in self.rows]
        if any(t < 2 for t in ts) or any(b <= a for a, b in zip(ts, ts[1:])):
            raise ValueError(f"VerifyLatency.rows: t must be increasing and >= 2, got {ts!r}")

    @classmethod
    def from_points(cls, decode: TableLatency, points) -> VerifyLatency:
        """From (b, t, seconds) triples in any order."""
        by: dict[int, list[tuple[int, float]]] = {}
        for b, t, sec in points:
            by.setdefault(int(t), []).append((int(b), float(sec)))
        return cls(decode, tuple((t, TableLatency.from_points(by[t])) for t in sorted(by)))

    def __call__(self, b, t) -> float:
        """Seconds for b rows of t tokens (the decode table at b * t tokens with no check measured)."""
        if not self.rows:
            return float(self.decode(b * t))
        ts = np.array([1.0] + [float(t_) for t_, _ in self.rows])
        ys = np.array([float(self.decode(b))] + [float(table(b)) for _, table in self.rows])
        if t <= ts[-1]:
            return float(np.interp(t, ts, ys))
        slope = max(0.0, (ys[-1] - ys[-2]) / (ts[-1] - ts[-2]))
        return float(ys[-1] + slope * (t - ts[-1]))


StepLatency = LatencyModel | TableLatency
