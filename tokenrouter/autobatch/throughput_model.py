"""The throughput model that chooses B, the batch a worker waits for under delayed batching.

A discrete-time Markov chain over where the requests are. For two models (a, b) and concurrency C
the state is n, the number of requests on model a (the rest are on b; a request in transit counts
as on its target). A time slot lasts tau = SLOT_FRACTION x the smallest step period. In a slot,
worker m completes a step with probability tau / T_m, where

    b_m    = min(n_m, max_batch_m)                         requests in its batch
    c_m    = h_m * u_m * b_m                               catch-up tokens in the step (a request
                                                           arrives once per 1/h_m steps on m, with
                                                           u_m unseen tokens)
    L_m    = a_m + s_m * b_m + k_m * c_m                   measured step latency (LatencyModel), or
             E_x[f_m(b_m + x (u_m - 1))], x ~ Bin(b_m, h_m)  read off the measured profile as a
                                                           function of the tokens in the step
                                                           (TableLatency): x rows are returning
                                                           requests with u_m tokens instead of 1
    W_m    = E[min(Erlang(B_m - n_m, lambda_m), w)]        delayed-batching hold when 1 <= n_m < B_m:
                                                           the worker waits at most w = batch_wait_s or
                                                           until B_m - n_m hand-offs arrive, at rate
             lambda_m = b_o * h_o / L_o                    (o: the other model), taken as Poisson
    D_m    = L_m * (1 + sigma * rho_o)                     compute time; with a shared device
             rho_o = D_o / T_o                             (sigma = 1) the other's steps slow this one
                                                           while they overlap; sigma = 0: own devices
    T_m    = W_m + D_m                                     step period (infinite when n_m = 0)

When a step of m completes, each of its b_m requests leaves for the other model with probability
h_m, independently (binomial); both workers may complete a step in the same slot (the two
binomials combine). The stationary distribution pi gives

    tokens/s            X = sum_n pi(n) * [b_a k_a / T_a(n) + b_b k_b / T_b(n)]
    per-token latency   C / X                                  (Little's law, closed system of C)

where k_m is the share of m's sampled tokens that are kept (RStitch discards the small model's
uncertain tokens). `choose_b` evaluates a grid of (B_a, B_b) and keeps the best X, subject to an
optional bound on the per-token latency; ties (within 0.1%) go to the smaller B.

Why sigma matters: with workers on their own devices (sigma = 0) a worker that holds back only
loses time in this model, so B = 1 wins; what a hold buys is device time for the other model's
steps and fewer, fuller steps of the holding one, which pays when the two share a device.

Taking turns (`turns=True`; the engine's default for two models on one CPU, engine/worker/cpu_turns.py).
The workers step one after the other, so a request handed off in a step is in the other
model's very next step: within one cycle both models can serve it, which the chain above (steps
overlapping in time) does not let happen. The turn-taking chain is over the steps themselves:
state (n, m, held), a step of model m with n requests on model 0, where `held` says whether
the other worker has already held back once since its last step. At its turn, a worker with
n_m requests
    passes the turn on        if n_m = 0, or if 1 <= n_m < B_m, it has not held since its last
                              step and the other has requests: the hold lasts the other's step
                              (batch_wait_s is shorter than a step here), and it steps next time;
    waits w, then steps       if n_m < B_m and the other has none (nothing can arrive);
    steps                     otherwise: time L_m, b_m k_m tokens, X ~ Bin(b_m, h_m) leave.
Tokens/s is E_pi[tokens of a step] / E_pi[time of a step] (renewal-reward).

Hand-off delay (`handoff_delay_s` = d > 0: workers on other machines, docs/distributed.md). A
request in transit between the workers is in neither batch and does no work. By Little's law
r d of the C requests are in transit on average, r the hand-off rate (requests leaving either
model per second, sum_n pi(n) sum_m b_m h_m / T_m), so the workers serve an effective
concurrency C_eff = C - r d, the fixed point of that equation at B = 1. Its tokens/s are read
between the chains at floor(C_eff) and ceil(C_eff) (none at 0 requests), for every B; the
per-token latency stays C / X, the transit included. So a long hand-off makes the models'
batches smaller, and B follows: the hold waits for requests that are away longer.

Approximations: steps are geometric (memoryless) rather than fixed-length; arrivals during a hold
are Poisson at the rate the other model's un-held steps would send them; catch-up tokens use the
mean suffix length; requests that finish are assumed replaced at once on the entry model (the
first one), which is also where the chain starts when it is not irreducible (h = 0 somewhere).
With more than two models the chain is not built: B = 1 with a note.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

SLOT_FRACTION = 0.25
_EPS_H = 1e-9  # h in (0, 1) exactly makes the chain irreducible; the limit is what is computed
_TIE = 1e-3  # within 0.1% of the best throughput, the smaller B wins


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
    extend rows batched it took 1.75 s against the table's 1.70 (docs/benchmarks.md)."""

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


@dataclass(frozen=True)
class RoutingStats:
    """How requests move on one model: h, the chance a request leaves after a step here; k, the
    share of sampled tokens that are kept; catch_up_tokens, the mean tokens computed for a request
    arriving here from a peer."""

    h: float
    k: float = 1.0
    catch_up_tokens: float = 0.0

    def __post_init__(self):
        for name, hi in (("h", 1.0), ("k", 1.0), ("catch_up_tokens", math.inf)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= hi):
                raise ValueError(f"RoutingStats.{name}: must be finite and in [0, {hi}], got {v!r}")


@dataclass(frozen=True)
class ThroughputPrediction:
    """What the model predicts for a choice of B (per model)."""

    batch_min: dict[str, int]  # B per model
    tokens_per_s: float | None  # kept output tokens per second, all requests together
    per_token_latency_s: float | None  # mean seconds per output token of one request (C / tokens_per_s)
    concurrency: int
    routing: dict[str, RoutingStats] = field(default_factory=dict)
    latency: dict[str, StepLatency] = field(default_factory=dict)
    batch_wait_s: float = 0.0
    shared_device: float = 0.0  # sigma
    turns: bool = False  # the workers take turns on one device: the turn-taking chain
    mean_requests: dict[str, float] = field(default_factory=dict)  # E[requests on each model]
    step_s: dict[str, float] = field(default_factory=dict)  # mean step period, weighted by steps
    distribution: tuple[float, ...] = ()  # pi(n), n = requests on the first model
    baseline_tokens_per_s: float | None = None  # the same inputs with B = 1 everywhere
    meets_latency_bound: bool | None = None  # None: no bound given
    note: str = ""
    handoff_delay_s: float = 0.0  # d: seconds a hand-off spends between the workers
    in_transit: float = 0.0  # E[requests in transit] (r d), out of `concurrency`


# ---- pieces ------------------------------------------------------------------------------
def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(X = x) for x = 0..n, X ~ Binomial(n, p)."""
    out = np.zeros(n + 1)
    if p <= 0.0:
        out[0] = 1.0
        return out
    if p >= 1.0:
        out[n] = 1.0
        return out
    x = np.arange(n + 1)
    log_comb = _log_factorial(n) - _log_factorials(x) - _log_factorials(n - x)
    out = np.exp(log_comb + x * math.log(p) + (n - x) * math.log1p(-p))
    return out / out.sum()


_LOG_FACT_CACHE = np.zeros(1)


def _log_factorials(x: np.ndarray) -> np.ndarray:
    global _LOG_FACT_CACHE
    top = int(np.max(x)) if np.size(x) else 0
    if top >= len(_LOG_FACT_CACHE):
        _LOG_FACT_CACHE = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, 2 * top + 2)))])
    return _LOG_FACT_CACHE[np.asarray(x, dtype=int)]


def _log_factorial(n: int) -> float:
    return float(_log_factorials(np.array([n]))[0])


def expected_wait(need, rate, wait_s: float) -> np.ndarray:
    """E[min(time until `need` Poisson(rate) arrivals, wait_s)], elementwise.

    E[min(X, w)] = sum_{j<need} P(Poisson(rate * w) > j) / rate for X ~ Erlang(need, rate)."""
    need = np.atleast_1d(np.asarray(need, dtype=int))
    rate = np.broadcast_to(np.asarray(rate, dtype=float), need.shape)
    out = np.zeros(need.shape)
    if wait_s <= 0:
        return out
    top = int(need.max()) if need.size else 0
    if top <= 0:
        return out
    x = rate * wait_s
    j = np.arange(top)
    with np.errstate(divide="ignore", invalid="ignore"):
        logx = np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), -np.inf)
        logpmf = -x[:, None] + j[None, :] * logx[:, None] - _log_factorials(j)[None, :]
        logpmf = np.where((j[None, :] == 0) & (x[:, None] == 0), 0.0, logpmf)
        tail = np.clip(1.0 - np.cumsum(np.exp(logpmf), axis=1), 0.0, 1.0)  # P(N > j)
        mask = j[None, :] < need[:, None]
        w = np.where(rate > 0, (tail * mask).sum(axis=1) / np.where(rate > 0, rate, 1.0), wait_s)
    return np.where(need > 0, np.minimum(w, wait_s), 0.0)


def stationary_of_reachable(P: np.ndarray) -> np.ndarray:
    """Stationary distribution of the states reachable from state 0, which may include transient
    ones (they get 0): GTH when the chain is irreducible, else least squares."""
    try:
        return stationary(P)
    except ValueError:
        n = P.shape[0]
        A = np.vstack([P.T - np.eye(n), np.ones((1, n))])
        rhs = np.zeros(n + 1)
        rhs[-1] = 1.0
        pi = np.clip(np.linalg.lstsq(A, rhs, rcond=None)[0], 0.0, None)
        return pi / pi.sum()


def stationary(P: np.ndarray) -> np.ndarray:
    """Stationary distribution of an irreducible stochastic matrix (GTH: no subtractions, stable)."""
    A = np.array(P, dtype=float, copy=True)
    n = A.shape[0]
    for k in range(n - 1, 0, -1):
        s = A[k, :k].sum()
        if s <= 0:
            raise ValueError("the chain is not irreducible")
        A[:k, k] /= s
        A[:k, :k] += np.outer(A[:k, k], A[k, :k])
    x = np.zeros(n)
    x[0] = 1.0
    for k in range(1, n):
        x[k] = x[:k] @ A[:k, k]
    return x / x.sum()


class TwoModelChain:
    """The chain for two models at one concurrency: everything that does not depend on B."""

    def __init__(self, names, latency, routing, concurrency, batch_wait_s, max_batch, sigma, turns=False):
        self.names = names
        self.turns = turns
        self.C = C = concurrency
        self.wait_s = batch_wait_s
        self.sigma = sigma
        n = np.arange(C + 1)
        self.n = (n, C - n)  # requests on each model, per state
        self.lat = [latency[m] for m in names]
        self.rt = [routing[m] for m in names]
        self.cap = [max(1, int(max_batch.get(m, C) if max_batch else C)) for m in names]
        self.b = [np.minimum(self.n[i], self.cap[i]) for i in range(2)]
        self.L = []
        for i in range(2):
            lat, rt, b = self.lat[i], self.rt[i], self.b[i]
            with np.errstate(divide="ignore"):
                self.L.append(np.where(b > 0, lat.expected(b, rt.h, rt.catch_up_tokens), np.inf))
        # arrivals into model i come from the other's un-held steps
        self.rate = []
        for i in range(2):
            o = 1 - i
            with np.errstate(invalid="ignore", divide="ignore"):
                self.rate.append(np.where(self.b[o] > 0, self.b[o] * self.rt[o].h / self.L[o], 0.0))
        self.both_stay = self.rt[0].h == 0 and self.rt[1].h == 0
        self.h = h = [min(max(rt.h, _EPS_H), 1 - _EPS_H) for rt in self.rt]
        # departure matrices: a step of model 0 moves X ~ Bin(b_0, h_0) from 0 to 1 (n -> n - X);
        # a step of model 1 moves Y ~ Bin(b_1, h_1) the other way (n -> n + Y); both: n - X + Y.
        D0 = np.zeros((C + 1, C + 1))
        D1 = np.zeros((C + 1, C + 1))
        D01 = np.zeros((C + 1, C + 1))
        for s in range(C + 1):
            b0, b1 = int(self.b[0][s]), int(self.b[1][s])
            px, py = binomial_pmf(b0, h[0]), binomial_pmf(b1, h[1])
            D0[s, s - b0 : s + 1] = px[::-1]
            D1[s, s : s + b1 + 1] = py
            D01[s, s - b0 : s + b1 + 1] = np.convolve(px[::-1], py)
        self.D = (D0, D1, D01)
        self._waits: dict[tuple[int, int], np.ndarray] = {}
        self._pmfs: dict[tuple[int, int], np.ndarray] = {}

    def wait(self, i: int, B: int) -> np.ndarray:
        key = (i, B)
        if key not in self._waits:
            n = self.n[i]
            need = np.where((n >= 1) & (n < B), B - n, 0)
            self._waits[key] = expected_wait(need, self.rate[i], self.wait_s)
        return self._waits[key]

    def periods(self, B: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(T, D) per model: step period and its compute part, per state."""
        W = [self.wait(i, B[i]) for i in range(2)]
        D = [self.L[0].copy(), self.L[1].copy()]
        T = [W[0] + D[0], W[1] + D[1]]
        if self.sigma > 0:
            busy = [self.b[i] > 0 for i in range(2)]
            for _ in range(200):  # D_m = L_m (1 + sigma D_o / T_o): a contraction, a few rounds
                rho = [np.divide(D[i], T[i], out=np.zeros_like(D[i]), where=busy[i]) for i in range(2)]
                new = [self.L[i] * (1 + self.sigma * rho[1 - i]) for i in range(2)]
                delta = max(
                    float(np.max(np.abs(new[i][busy[i]] - D[i][busy[i]]) / self.L[i][busy[i]], initial=0.0))
                    for i in range(2)
                )
                D = new
                T = [W[0] + D[0], W[1] + D[1]]
                if delta < 1e-10:
                    break
        return T, D

    def evaluate(self, B: Sequence[int]) -> tuple[float, np.ndarray, list[np.ndarray]]:
        """(tokens/s, pi, T) for B = (B_0, B_1)."""
        if self.turns:
            return self.evaluate_turns(B)
        T, _ = self.periods(B)
        finite = np.concatenate([t[np.isfinite(t)] for t in T])
        slot = SLOT_FRACTION * float(finite.min())
        p = [np.where(np.isfinite(t), slot / t, 0.0) for t in T]
        pi = self.chain_stationary(p)
        rate = [np.where(self.b[i] > 0, self.b[i] * self.rt[i].k / T[i], 0.0) for i in range(2)]
        return float(pi @ (rate[0] + rate[1])), pi, T

    def _leaving(self, m: int, b: int) -> np.ndarray:
        """P(x of b requests leave model m after its step), cached: every B re-reads them."""
        key = (m, b)
        if key not in self._pmfs:
            self._pmfs[key] = binomial_pmf(b, self.h[m])
        return self._pmfs[key]

    def _next_step(self, n: int, m: int, held_m: int, held_o: int, B: Sequence[int]) -> tuple[int, int, int]:
        """The step that follows when worker m gets the turn with n requests on model 0:
        (n, stepping model, the other's held flag), after at most two passes of the turn."""
        for _ in range(3):
            o = 1 - m
            mine, theirs = int(self.n[m][n]), int(self.n[o][n])
            if mine > 0 and not (mine < B[m] and not held_m and theirs > 0):
                return n, m, held_o
            m, held_m, held_o = o, held_o, int(mine > 0)  # m passes: held if it had requests
        raise AssertionError("a turn always reaches a step")  # C >= 1: someone has requests

    def evaluate_turns(self, B: Sequence[int]) -> tuple[float, np.ndarray, list[np.ndarray]]:
        """(tokens/s, pi over n (time-weighted), T) when the workers take turns (module docstring)."""
        C, S = self.C, self.C + 1
        if self.both_stay:  # nobody ever moves: everyone stays on model 0, stepping alone
            wait = self.wait_s if C < B[0] else 0.0
            pi_n = np.zeros(S)
            pi_n[C] = 1.0
            period = wait + float(self.L[0][C])
            return int(self.b[0][C]) * self.rt[0].k / period, pi_n, [np.full(S, period), np.full(S, np.inf)]
        N = 4 * S  # step (n, m, held) is row (2 m + held) S + n

        def rows(triples) -> np.ndarray:
            return np.array([(2 * m + held) * S + n for n, m, held in triples])

        # where the turn goes after a step of m that leaves n on model 0: the same for every step
        after = {
            (m, held): rows(self._next_step(n, 1 - m, held, 0, B) for n in range(S)) for m in (0, 1) for held in (0, 1)
        }
        P = np.zeros((N, N))
        t, k = np.zeros(N), np.zeros(N)
        for m in (0, 1):
            sign = -1 if m == 0 else 1  # n counts the requests on model 0
            for n in range(S):
                b = int(self.b[m][n])
                if b == 0:
                    continue
                wait = self.wait_s if int(self.n[m][n]) < B[m] and int(self.n[1 - m][n]) == 0 else 0.0
                pmf = self._leaving(m, b)
                for held in (0, 1):
                    i = (2 * m + held) * S + n
                    t[i], k[i] = wait + float(self.L[m][n]), b * self.rt[m].k
                    np.add.at(P[i], after[(m, held)][n + sign * np.arange(b + 1)], pmf)
        start = int(rows([self._next_step(C, 0, 0, 0, B)])[0])
        seen = np.zeros(N, dtype=bool)
        seen[start] = True
        todo = [start]
        while todo:  # the states reachable from all requests on model 0: the chain's closed class
            for j in np.flatnonzero(P[todo.pop()] > 0):
                if not seen[j]:
                    seen[j] = True
                    todo.append(int(j))
        live = np.flatnonzero(seen)
        pi = np.zeros(N)
        pi[live] = stationary_of_reachable(P[np.ix_(live, live)])
        total = float(pi @ t)
        X = float(pi @ k) / total
        pi_n = (pi * t / total).reshape(4, S).sum(axis=0)  # share of time with n on model 0
        T = []
        for m in range(2):
            share = float(pi[2 * m * S : (2 * m + 2) * S].sum())
            period = total / share if share > 0 else math.inf
            T.append(np.where(self.b[m] > 0, period, np.inf))
        return X, pi_n, T

    def matrix(self, p: list[np.ndarray]) -> np.ndarray:
        q0, q1 = 1 - p[0], 1 - p[1]
        D0, D1, D01 = self.D
        P = (p[0] * q1)[:, None] * D0 + (q0 * p[1])[:, None] * D1 + (p[0] * p[1])[:, None] * D01
        P[np.diag_indices_from(P)] += q0 * q1
        return P

    def chain_stationary(self, p: list[np.ndarray]) -> np.ndarray:
        if self.both_stay:  # nobody ever moves: everyone stays where requests start (model 0)
            pi = np.zeros(self.C + 1)
            pi[self.C] = 1.0
            return pi
        return stationary(self.matrix(p))


def handoff_rate(pair: TwoModelChain, pi: np.ndarray, T: list[np.ndarray]) -> float:
    """Requests leaving either model per second: sum_n pi(n) sum_m b_m h_m / T_m."""
    rate = 0.0
    for i in range(2):
        per_step = np.where(
            np.isfinite(T[i]) & (pair.b[i] > 0), pair.b[i] * pair.rt[i].h / np.where(np.isfinite(T[i]), T[i], 1.0), 0.0
        )
        rate += float(pi @ per_step)
    return rate


class TransitMix:
    """The chains at the effective concurrency a hand-off delay leaves (module docstring): the
    chain at floor(C_eff) weighted 1 - w and the one at ceil(C_eff) weighted w, where C_eff is the
    fixed point of C_eff = C - r(C_eff) d at B = 1. With d = 0 it is the chain at C alone."""

    ROUNDS = 50

    def __init__(self, make, C: int, delay: float):
        self.C, self.delay = C, delay
        self._make, self._chains = make, {}
        self.lo, self.hi, self.w, self.in_transit = C, C, 0.0, 0.0
        if delay <= 0:
            return
        c_eff = float(C)
        for _ in range(self.ROUNDS):  # a contraction for any realistic d (r d < C); damped anyway
            lo, hi, w = self._split(c_eff)
            r = sum(weight * self._rate(c, [1, 1]) for c, weight in ((lo, 1 - w), (hi, w)) if weight > 0)
            new = max(0.0, C - r * delay)
            if abs(new - c_eff) < 1e-6:
                c_eff = new
                break
            c_eff = 0.5 * (c_eff + new)
        self.lo, self.hi, self.w = self._split(c_eff)
        self.in_transit = C - c_eff

    @staticmethod
    def _split(c: float) -> tuple[int, int, float]:
        lo = int(math.floor(c))
        return lo, lo + 1, c - lo

    def chain(self, c: int) -> TwoModelChain | None:
        if c < 1:
            return None
        if c not in self._chains:
            self._chains[c] = self._make(c)
        return self._chains[c]

    def _rate(self, c: int, B) -> float:
        pair = self.chain(c)
        if pair is None:
            return 0.0
        _, pi, T = pair.evaluate([min(b, c) for b in B])
        return handoff_rate(pair, pi, T)

    @property
    def main(self) -> TwoModelChain:
        """The chain whose distribution a prediction reports: the heavier of the two (at C when d = 0)."""
        c = self.hi if self.w >= 0.5 else self.lo
        return self.chain(max(1, min(c, self.C)))

    def evaluate(self, B) -> tuple[float, np.ndarray, list[np.ndarray]]:
        """(tokens/s, pi, T): tokens/s blended over the two chains; pi and T of `main`."""
        main = self.main
        if self.delay <= 0:
            return main.evaluate(B)
        X = 0.0
        for c, weight in ((self.lo, 1 - self.w), (self.hi, self.w)):
            pair = self.chain(min(c, self.C))
            if weight > 0 and pair is not None:
                X += weight * pair.evaluate([min(b, pair.C) for b in B])[0]
        _, pi, T = main.evaluate([min(b, main.C) for b in B])
        return X, pi, T


def transition_matrix(
    latency: Mapping[str, StepLatency],
    routing: Mapping[str, RoutingStats],
    concurrency: int,
    batch_min: Mapping[str, int] | None = None,
    batch_wait_s: float = 0.02,
    max_batch: Mapping[str, int] | None = None,
    shared_device: float = 0.0,
) -> np.ndarray:
    """The (C+1) x (C+1) one-slot transition matrix of the chain of overlapping steps (not the
    turn-taking one); state n = requests on the first model."""
    names = _names(latency, routing)
    if len(names) != 2:
        raise ValueError("the chain is built for two models")
    pair = TwoModelChain(names, latency, routing, _check_c(concurrency), batch_wait_s, max_batch, shared_device)
    B = [int((batch_min or {}).get(m, 1)) for m in names]
    T, _ = pair.periods(B)
    finite = np.concatenate([t[np.isfinite(t)] for t in T])
    slot = SLOT_FRACTION * float(finite.min())
    return pair.matrix([np.where(np.isfinite(t), slot / t, 0.0) for t in T])


def _names(latency, routing) -> list[str]:
    names = list(routing)
    missing = [m for m in names if m not in latency]
    if missing:
        raise ValueError(f"no latency model for {missing}")
    if not names:
        raise ValueError("give at least one model")
    return names


def _check_c(concurrency) -> int:
    if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
        raise ValueError(f"concurrency: must be an int >= 1, got {concurrency!r}")
    return int(concurrency)


def candidate_bs(limit: int) -> list[int]:
    """B values to try, 1..limit: all of them up to 16, then a geometric grid (x1.5) and the limit."""
    if limit <= 16:
        return list(range(1, limit + 1))
    out = set(range(1, 9))
    v = 8.0
    while v < limit:
        v *= 1.5
        out.add(min(limit, round(v)))
    out.add(limit)
    return sorted(out)


def _prediction(
    pair: TwoModelChain, B, X, pi, T, routing, latency, baseline, bound, note, mix: TransitMix | None = None
) -> ThroughputPrediction:
    names = pair.names
    C = mix.C if mix is not None else pair.C  # every request, those in transit too (Little's law)
    step_s = {}
    mean_requests = {}
    for i, m in enumerate(names):
        mean_requests[m] = float(pi @ pair.n[i])
        rate = np.where(np.isfinite(T[i]), 1.0 / T[i], 0.0)
        steps = float(pi @ rate)
        step_s[m] = float(pi @ (rate * np.where(np.isfinite(T[i]), T[i], 0.0))) / steps if steps > 0 else math.inf
    latency_s = C / X if X > 0 else math.inf
    return ThroughputPrediction(
        batch_min=dict(zip(names, (int(b) for b in B))),
        tokens_per_s=X,
        per_token_latency_s=latency_s,
        concurrency=C,
        routing=dict(routing),
        latency={m: latency[m] for m in names},
        batch_wait_s=pair.wait_s,
        shared_device=pair.sigma,
        turns=pair.turns,
        mean_requests=mean_requests,
        step_s=step_s,
        distribution=tuple(float(v) for v in pi),
        baseline_tokens_per_s=baseline,
        meets_latency_bound=None if bound is None else latency_s <= bound,
        note=note,
        handoff_delay_s=mix.delay if mix is not None else 0.0,
        in_transit=mix.in_transit if mix is not None else 0.0,
    )


def _check_delay(d) -> float:
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0.0 <= d < math.inf):
        raise ValueError(f"handoff_delay_s: must be a finite number >= 0, got {d!r}")
    return float(d)


def _single(name, latency, routing, C, batch_wait_s, max_batch, bound) -> ThroughputPrediction:
    cap = int((max_batch or {}).get(name, C))
    b = min(C, cap)
    X = b * routing[name].k / float(latency[name](b, 0.0))
    lat = C / X if X > 0 else math.inf
    return ThroughputPrediction(
        batch_min={name: 1},
        tokens_per_s=X,
        per_token_latency_s=lat,
        concurrency=C,
        routing=dict(routing),
        latency={name: latency[name]},
        batch_wait_s=batch_wait_s,
        mean_requests={name: float(C)},
        step_s={name: float(latency[name](b, 0.0))},
        distribution=(1.0,),
        baseline_tokens_per_s=X,
        meets_latency_bound=None if bound is None else lat <= bound,
        note="one model: no hand-offs to wait for, B = 1",
    )


def predict(
    latency: Mapping[str, StepLatency],
    routing: Mapping[str, RoutingStats],
    concurrency: int,
    batch_min: Mapping[str, int] | None = None,
    batch_wait_s: float = 0.02,
    max_batch: Mapping[str, int] | None = None,
    shared_device: float = 0.0,
    turns: bool = False,
    handoff_delay_s: float = 0.0,
) -> ThroughputPrediction:
    """Predicted tokens/s and per-token latency for a given B per model (default 1).

    `routing`'s order names the models; the first is the one requests start on.
    `handoff_delay_s`: seconds a hand-off spends between the workers (module docstring)."""
    names, _, mix = _start(
        latency, routing, concurrency, batch_wait_s, max_batch, shared_device, turns, handoff_delay_s, None
    )
    if isinstance(mix, ThroughputPrediction):
        return mix
    B = [max(1, int((batch_min or {}).get(m, 1))) for m in names]
    X, pi, T = mix.evaluate(B)
    X1 = X if B == [1, 1] else mix.evaluate([1, 1])[0]
    return _prediction(mix.main, B, X, pi, T, routing, latency, X1, None, "", mix)


def _start(latency, routing, concurrency, batch_wait_s, max_batch, shared_device, turns, handoff_delay_s, bound):
    """What `predict` and `choose_b` start from: the models' names, C, and the two-model chain's
    TransitMix, or the finished prediction where there is one model or more than two."""
    names = _names(latency, routing)
    C = _check_c(concurrency)
    delay = _check_delay(handoff_delay_s)
    if len(names) == 1:
        return names, C, _single(names[0], latency, routing, C, batch_wait_s, max_batch, bound)
    if len(names) > 2:
        return names, C, _many(names, latency, routing, C, batch_wait_s)

    def chain(c: float) -> TwoModelChain:
        return TwoModelChain(names, latency, routing, c, batch_wait_s, max_batch, shared_device, turns)

    return names, C, TransitMix(chain, C, delay)


def _many(names, latency, routing, C, batch_wait_s) -> ThroughputPrediction:
    return ThroughputPrediction(
        batch_min=dict.fromkeys(names, 1),
        tokens_per_s=None,
        per_token_latency_s=None,
        concurrency=C,
        routing=dict(routing),
        latency={m: latency[m] for m in names},
        batch_wait_s=batch_wait_s,
        note=f"{len(names)} models: the throughput model covers two; B = 1 everywhere",
    )


def choose_b(
    latency: Mapping[str, StepLatency],
    routing: Mapping[str, RoutingStats],
    concurrency: int,
    batch_wait_s: float = 0.02,
    latency_bound_s: float | None = None,
    max_batch: Mapping[str, int] | None = None,
    shared_device: float = 0.0,
    turns: bool = False,
    candidates: Mapping[str, Sequence[int]] | None = None,
    handoff_delay_s: float = 0.0,
) -> ThroughputPrediction:
    """Pick B per model (grid over 1..min(C, max_batch)) maximising predicted tokens/s.

    With `latency_bound_s`, only B whose predicted per-token latency is within the bound qualify;
    if none does, B = 1 everywhere (no holding) and `meets_latency_bound` is False. Note that at a
    fixed concurrency Little's law makes the mean per-token latency C / tokens_per_s, so the bound
    either excludes every B that is slower than it allows or none."""
    if latency_bound_s is not None and not (latency_bound_s > 0):
        raise ValueError(f"latency_bound_s: must be > 0, got {latency_bound_s!r}")
    names, C, mix = _start(
        latency, routing, concurrency, batch_wait_s, max_batch, shared_device, turns, handoff_delay_s, latency_bound_s
    )
    if isinstance(mix, ThroughputPrediction):
        return mix
    pair = mix.main
    X1, pi1, T1 = mix.evaluate([1, 1])
    if batch_wait_s <= 0:
        return _prediction(
            pair, [1, 1], X1, pi1, T1, routing, latency, X1, latency_bound_s, "batch_wait_s = 0: B has no effect", mix
        )
    grids = []
    for i, m in enumerate(names):
        limit = min(C, pair.cap[i])
        given = (candidates or {}).get(m)
        grids.append(sorted({max(1, min(limit, int(b))) for b in given}) if given else candidate_bs(limit))
    results = []  # (X, B, pi, T) of every B that meets the bound
    for b0 in grids[0]:
        for b1 in grids[1]:
            X, pi, T = (X1, pi1, T1) if (b0, b1) == (1, 1) else mix.evaluate([b0, b1])
            if latency_bound_s is None or (X > 0 and C / X <= latency_bound_s):
                results.append((X, [b0, b1], pi, T))
    if not results:
        return _prediction(
            pair, [1, 1], X1, pi1, T1, routing, latency, X1, latency_bound_s, "no B meets the latency bound: B = 1", mix
        )
    top = max(r[0] for r in results)
    X, B, pi, T = min((r for r in results if r[0] >= top * (1 - _TIE)), key=lambda r: (sum(r[1]), r[1]))
    return _prediction(pair, B, X, pi, T, routing, latency, X1, latency_bound_s, "", mix)
