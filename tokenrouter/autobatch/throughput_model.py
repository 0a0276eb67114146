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

from .latency_models import StepLatency
from .markov import SLOT_FRACTION, TransitMix, TwoModelChain

TIE = 1e-3  # within 0.1% of the best throughput, the smaller B wins


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
    X, B, pi, T = min((r for r in results if r[0] >= top * (1 - TIE)), key=lambda r: (sum(r[1]), r[1]))
    return _prediction(pair, B, X, pi, T, routing, latency, X1, latency_bound_s, "", mix)
