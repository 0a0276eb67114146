"""The Markov chains under the throughput model (throughput_model.py says what they model):
the chain of two workers' overlapping steps over time slots, the turn-taking chain over steps,
and the mix of chains that a hand-off delay calls for; with the small pieces they are built
from (binomial arrivals, the expected hold, stationary distributions)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

SLOT_FRACTION = 0.25
EPS_H = 1e-9  # h in (0, 1) exactly makes the chain irreducible; the limit is what is computed


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
        self.h = h = [min(max(rt.h, EPS_H), 1 - EPS_H) for rt in self.rt]
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
