"""Choosing B: the throughput model (a Markov chain over where requests are), the step-latency
profile measured in each worker's thread, and delayed_batching="auto" in the engine."""

from __future__ import annotations

import math
import random
import threading

import anyio
import numpy as np
import pytest

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import wait_all_free
from tokenrouter import AutoBatchingOptions, ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.autobatch import latency_profile
from tokenrouter.autobatch.latency_models import LatencyModel, TableLatency, VerifyLatency
from tokenrouter.autobatch.markov import binomial_pmf, expected_wait, stationary
from tokenrouter.autobatch.throughput_model import RoutingStats, choose_b, predict, transition_matrix
from tokenrouter.engine import native
from tokenrouter.policies import RStitch
from tokenrouter.testing import kv_blocks_in_use, workers_of

SMALL = LatencyModel(a=0.010, s=0.001, k=0.0002)
LARGE = LatencyModel(a=0.040, s=0.004, k=0.0008)
LAT = {"small": SMALL, "large": LARGE}
AUTO_THREAD = "tokenrouter-auto-batching"  # the name of the throughput model's controller thread


def _rt(h_s, h_l, k_s=1.0, k_l=1.0, u_s=0.0, u_l=0.0):
    return {"small": RoutingStats(h_s, k_s, u_s), "large": RoutingStats(h_l, k_l, u_l)}


# ---- the chain ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "C, routing, B, wait_s, caps, sigma",
    [
        (1, _rt(0.3, 0.6), None, 0.02, None, 0.0),
        (8, _rt(0.1, 0.5, 0.9, 1.0, 3, 4), {"small": 3, "large": 5}, 0.02, None, 0.0),
        (12, _rt(0.5, 0.5), {"large": 12}, 0.1, {"small": 4, "large": 6}, 1.0),
        (20, _rt(1.0, 1.0), {"small": 2}, 0.01, None, 0.5),
        (6, _rt(0.0, 0.7), None, 0.02, None, 0.0),
    ],
)
def test_chain_is_a_stochastic_matrix_and_pi_sums_to_one(C, routing, B, wait_s, caps, sigma):
    P = transition_matrix(LAT, routing, C, B, wait_s, caps, sigma)
    assert P.shape == (C + 1, C + 1)
    assert (P >= 0).all()
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    pred = predict(LAT, routing, C, B, wait_s, caps, sigma)
    pi = np.array(pred.distribution)
    assert pi.shape == (C + 1,) and (pi >= -1e-15).all()
    assert math.isclose(pi.sum(), 1.0, abs_tol=1e-12)
    assert pred.tokens_per_s > 0
    assert math.isclose(pred.per_token_latency_s, C / pred.tokens_per_s)
    if 0 < routing["small"].h < 1 and 0 < routing["large"].h < 1:
        np.testing.assert_allclose(pi @ P, pi, atol=1e-12)  # stationary
    assert math.isclose(sum(pred.mean_requests.values()), C)


def test_gth_matches_a_direct_solve():
    rng = np.random.default_rng(0)
    P = rng.random((7, 7))
    P /= P.sum(axis=1, keepdims=True)
    A = np.vstack([P.T - np.eye(7), np.ones(7)])
    direct = np.linalg.lstsq(A, np.r_[np.zeros(7), 1.0], rcond=None)[0]
    np.testing.assert_allclose(stationary(P), direct, atol=1e-12)


@pytest.mark.parametrize("h_l", [0.0, 0.4])
def test_no_hand_offs_keep_everyone_on_the_small_model(h_l):
    C, k_s = 10, 0.8
    pred = predict(LAT, _rt(0.0, h_l, k_s=k_s, u_s=5.0), C, {"small": 4, "large": 4})
    assert math.isclose(pred.tokens_per_s, C * k_s / SMALL(C, 0), rel_tol=1e-6)
    assert pred.distribution[C] > 1 - 1e-6
    assert math.isclose(pred.mean_requests["small"], C, rel_tol=1e-6)


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_symmetric_models_and_routing_give_a_symmetric_distribution(sigma):
    lat = {"a": SMALL, "b": SMALL}
    rt = {"a": RoutingStats(0.3, 0.9, 2.0), "b": RoutingStats(0.3, 0.9, 2.0)}
    pred = predict(lat, rt, 9, {"a": 3, "b": 3}, 0.02, None, sigma)
    pi = np.array(pred.distribution)
    np.testing.assert_allclose(pi, pi[::-1], atol=1e-12)
    assert math.isclose(pred.mean_requests["a"], 4.5, rel_tol=1e-9)


def test_one_request_matches_the_hand_solution():
    """C = 1: no batching, no overlap; the request alternates with geometric sojourns, so
    pi(small) = (h_L/T_L) / (h_S/T_S + h_L/T_L), with T including the catch-up tokens."""
    h_s, h_l, k_s, u_s, u_l = 0.2, 0.5, 0.7, 6.0, 3.0
    pred = predict(LAT, _rt(h_s, h_l, k_s=k_s, u_s=u_s, u_l=u_l), 1, {"small": 1, "large": 1}, 0.02, None, 1.0)
    t_s = SMALL(1, h_s * u_s)
    t_l = LARGE(1, h_l * u_l)
    pi_small = (h_l / t_l) / (h_s / t_s + h_l / t_l)
    assert math.isclose(pred.distribution[1], pi_small, rel_tol=1e-9)
    assert math.isclose(pred.tokens_per_s, pi_small * k_s / t_s + (1 - pi_small) / t_l, rel_tol=1e-9)


@pytest.mark.parametrize("lat", [LAT, "table"])
def test_always_handing_off_alternates_every_step(lat):
    """h = 1 on both models (p = 1): one request alternates after every step, each arrival with
    its catch-up, so X = (k_S + k_L) / (T_S + T_L)."""
    if lat == "table":
        lat = {"small": TableLatency((1, 4, 16), (0.01, 0.03, 0.05)), "large": TableLatency((1, 8), (0.04, 0.2), 2.0)}
    k_s, u_s, u_l = 0.6, 3.0, 5.0
    pred = predict(lat, _rt(1.0, 1.0, k_s=k_s, u_s=u_s, u_l=u_l), 1)
    t_s = float(lat["small"].expected(1, 1.0, u_s))
    t_l = float(lat["large"].expected(1, 1.0, u_l))
    assert math.isclose(pred.distribution[1], t_s / (t_s + t_l), rel_tol=1e-6)
    assert math.isclose(pred.tokens_per_s, (k_s + 1.0) / (t_s + t_l), rel_tol=1e-6)


# ---- the turn-taking chain (two workers on one CPU) -------------------------------------------
@pytest.mark.parametrize("h_l", [0.0, 0.4])
def test_turns_no_hand_offs_keep_everyone_on_the_small_model(h_l):
    C, k_s = 10, 0.8
    pred = predict(LAT, _rt(0.0, h_l, k_s=k_s, u_s=5.0), C, {"small": 4, "large": 4}, turns=True)
    assert pred.turns
    assert math.isclose(pred.tokens_per_s, C * k_s / SMALL(C, 0), rel_tol=1e-6)
    assert math.isclose(pred.mean_requests["small"], C, rel_tol=1e-6)


@pytest.mark.parametrize("C", [1, 7])
def test_turns_always_handing_off_serves_everyone_on_both_models_each_cycle(C):
    """h = 1 on both (p = 1): each step sends its whole batch to the other model, which takes it in
    its very next step, so a cycle is one step of each on all C: X = C (k_S + k_L) / (T_S + T_L)."""
    k_s, u_s, u_l = 0.6, 3.0, 5.0
    pred = predict(LAT, _rt(1.0, 1.0, k_s=k_s, u_s=u_s, u_l=u_l), C, turns=True)
    t_s = float(SMALL.expected(C, 1.0, u_s))
    t_l = float(LARGE.expected(C, 1.0, u_l))
    assert math.isclose(pred.tokens_per_s, C * (k_s + 1.0) / (t_s + t_l), rel_tol=1e-6)
    assert math.isclose(pred.mean_requests["small"], C * t_s / (t_s + t_l), rel_tol=1e-6)


def test_turns_one_request_matches_the_hand_solution():
    """C = 1: the other worker has nothing, so turns change nothing: the same hand solution as
    the chain of overlapping steps (geometric sojourns on each model)."""
    h_s, h_l, k_s, u_s, u_l = 0.2, 0.5, 0.7, 6.0, 3.0
    pred = predict(LAT, _rt(h_s, h_l, k_s=k_s, u_s=u_s, u_l=u_l), 1, turns=True)
    t_s = SMALL(1, h_s * u_s)
    t_l = LARGE(1, h_l * u_l)
    pi_small = (h_l / t_l) / (h_s / t_s + h_l / t_l)
    assert math.isclose(pred.mean_requests["small"], pi_small, rel_tol=1e-9)
    assert math.isclose(pred.tokens_per_s, pi_small * k_s / t_s + (1 - pi_small) / t_l, rel_tol=1e-9)


def test_turns_serve_a_hand_off_in_the_next_step_so_they_beat_overlapping_steps_on_one_device():
    """Both chains on the same inputs: with turns a request handed off is in the other's very next
    step; with overlapping steps on a shared device (sigma = 1) it waits for a step to finish."""
    rt = _rt(0.5, 0.4, k_s=0.5, u_s=2.0, u_l=9.0)
    turns = predict(LAT, rt, 16, turns=True).tokens_per_s
    shared = predict(LAT, rt, 16, shared_device=1.0).tokens_per_s
    assert turns > shared


def test_turns_a_hold_with_nothing_to_wait_for_runs_out():
    """h = 1 on both and B above C: every step finds the other model empty, so nothing can arrive
    and each worker waits out batch_wait_s before it steps: X = C (k_S + k_L) / (T_S + T_L + 2 w)."""
    C, w = 5, 0.02
    rt = _rt(1.0, 1.0)
    pred = predict(LAT, rt, C, {"small": 9, "large": 9}, batch_wait_s=w, turns=True)
    t_s, t_l = float(SMALL.expected(C, 1.0, 0.0)), float(LARGE.expected(C, 1.0, 0.0))
    assert math.isclose(pred.tokens_per_s, 2 * C / (t_s + t_l + 2 * w), rel_tol=1e-6)
    choice = choose_b(LAT, _rt(0.3, 0.6, 0.8, 1.0, 2.0, 6.0), 12, turns=True)
    assert choice.turns and choice.tokens_per_s >= choice.baseline_tokens_per_s


def test_table_latency_reads_the_profile():
    # repeated token counts are averaged; a dip (8 tokens cheaper than 4) is pooled away
    t = TableLatency.from_points([(1, 0.1), (4, 0.3), (4, 0.5), (8, 0.2), (16, 0.6)])
    assert t.tokens == (1, 4, 8, 16)
    assert t.seconds == pytest.approx((0.1, 0.3, 0.3, 0.6))
    assert t(2) == pytest.approx(0.1 + 0.2 / 3)  # linear between points
    assert t(16, 16) == pytest.approx(0.6 + 16 * 0.3 / 8)  # beyond the last: along the last segment
    assert t.with_scale(2.0)(1) == pytest.approx(0.2)
    # a step of 3 rows, each returning with probability 0.4 with 5 tokens instead of 1
    pmf = binomial_pmf(3, 0.4)
    by_hand = sum(pmf[x] * float(t.at(3 + 4 * x)) for x in range(4))
    assert t.expected(3, 0.4, 5.0) == pytest.approx(by_hand)
    np.testing.assert_allclose(t.expected(np.array([3, 3, 1]), 0.4, 5.0), [by_hand, by_hand, t.expected(1, 0.4, 5.0)])
    for bad in [
        {"tokens": (), "seconds": ()},
        {"tokens": (2, 1), "seconds": (1, 1)},
        {"tokens": (1,), "seconds": (0.0,)},
        {"tokens": (1,), "seconds": (1.0,), "scale": 0.0},
    ]:
        with pytest.raises(ValueError, match="TableLatency"):
            TableLatency(**bad)


def test_verify_latency_reads_the_checks_by_rows_and_tokens():
    decode = TableLatency.from_points([(1, 0.5), (4, 0.6), (16, 1.0)])
    checks = VerifyLatency.from_points(decode, [(1, 3, 0.7), (16, 3, 2.0), (1, 5, 0.9), (16, 5, 3.0)])
    assert checks(1, 1) == pytest.approx(0.5)  # t = 1: the decode rows
    assert checks(16, 3) == pytest.approx(2.0)  # measured
    assert checks(16, 2) == pytest.approx((1.0 + 2.0) / 2)  # between decode and t = 3
    assert checks(4, 3) == pytest.approx(0.7 + 3 * 1.3 / 15)  # linear in b between measured rows
    assert checks(16, 4) == pytest.approx(2.5)  # linear in t
    assert checks(16, 9) == pytest.approx(3.0 + 4 * 0.5)  # beyond the last t: along the last segment
    assert checks(32, 3) == pytest.approx(2.0 + 16 * 1.3 / 15)  # beyond the last b too
    assert VerifyLatency(decode)(4, 4) == pytest.approx(1.0)  # nothing measured: the decode table at b * t
    with pytest.raises(ValueError, match="VerifyLatency"):
        VerifyLatency(decode, ((3, decode), (2, decode)))


def test_calibration_scales_the_profile_to_the_steps_observed():
    from tokenrouter.autobatch.controller import MIN_CALIBRATION_STEPS, calibrate

    t = TableLatency((1, 10), (0.1, 1.0))
    steps = {1: 8.0, 10: 4.0}  # 8 one-token steps and 4 ten-token ones: 4.8 s by the profile
    got = calibrate(t, {"steps": 12, "step_tokens": steps, "time_step": 7.2})
    assert got.scale == pytest.approx(1.5) and got.tokens == t.tokens
    assert calibrate(t, {"steps": MIN_CALIBRATION_STEPS - 1, "step_tokens": {1: 9.0}, "time_step": 9.0}) is t
    assert calibrate(t, {"steps": 12, "step_tokens": steps, "time_step": 1e6}).scale == 4.0  # bounded


def test_expected_wait_by_hand():
    lam, w = 30.0, 0.05
    got = expected_wait([0, 1, 2], [lam, lam, 0.0], w)
    assert got[0] == 0.0
    assert math.isclose(got[1], (1 - math.exp(-lam * w)) / lam, rel_tol=1e-9)  # E[min(Exp, w)]
    assert got[2] == w  # nothing arrives: the worker holds the whole batch_wait_s
    # two arrivals: E[min(Erlang(2), w)] = (P(N>=1) + P(N>=2)) / lam, N ~ Poisson(lam w)
    x = lam * w
    two = ((1 - math.exp(-x)) + (1 - math.exp(-x) * (1 + x))) / lam
    assert math.isclose(expected_wait([2], [lam], w)[0], two, rel_tol=1e-9)


# ---- choosing B --------------------------------------------------------------------------
# Steps cost a fixed 20/50 ms whatever the batch (much cheaper per request in a big batch), the
# two models share one device, and a hold may last long enough to gather a batch.
FIXED = {"small": LatencyModel(a=0.02, s=1e-4), "large": LatencyModel(a=0.05, s=2e-4)}
FIXED_RT = _rt(0.1, 0.5, k_s=0.9, u_s=3.0, u_l=3.0)


def test_bigger_b_when_batching_pays():
    pred = choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.05, shared_device=1.0)
    assert max(pred.batch_min.values()) > 1, pred.batch_min
    assert pred.tokens_per_s > pred.baseline_tokens_per_s * 1.01
    assert pred.meets_latency_bound is None
    # with its own device each model only loses time by holding: B = 1
    own = choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.05, shared_device=0.0)
    assert own.batch_min == {"small": 1, "large": 1}
    # batch_wait_s = 0: B has no effect, the smallest is kept
    assert choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.0, shared_device=1.0).batch_min == {"small": 1, "large": 1}


def test_tight_latency_bound_gives_b_1():
    free = choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.05, shared_device=1.0)
    tight = choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.05, shared_device=1.0, latency_bound_s=1e-4)
    assert tight.batch_min == {"small": 1, "large": 1}
    assert tight.meets_latency_bound is False
    loose = choose_b(FIXED, FIXED_RT, 16, batch_wait_s=0.05, shared_device=1.0, latency_bound_s=10.0)
    assert loose.batch_min == free.batch_min and loose.meets_latency_bound is True


def test_b_is_capped_by_concurrency_and_batch_size():
    pred = choose_b(FIXED, FIXED_RT, 40, batch_wait_s=0.05, shared_device=1.0, max_batch={"small": 8, "large": 6})
    assert 1 <= pred.batch_min["small"] <= 8 and 1 <= pred.batch_min["large"] <= 6
    pred = choose_b(FIXED, FIXED_RT, 3, batch_wait_s=0.05, shared_device=1.0)
    assert all(1 <= b <= 3 for b in pred.batch_min.values())


def test_one_model_and_more_than_two_models():
    one = choose_b({"m": SMALL}, {"m": RoutingStats(0.0)}, 4)
    assert one.batch_min == {"m": 1} and math.isclose(one.tokens_per_s, 4 / SMALL(4))
    three = dict.fromkeys("abc", SMALL)
    many = choose_b(three, {m: RoutingStats(0.2) for m in "abc"}, 8)
    assert many.batch_min == {"a": 1, "b": 1, "c": 1}
    assert many.tokens_per_s is None and "B = 1" in many.note


# ---- a hand-off delay (workers on other machines) -----------------------------------------------
def test_one_request_pays_the_hand_off_delay_at_every_hand_off():
    """C = 1: the request is in transit r d of the time, so 1 / X grows by (hand-offs per token) x d
    (renewal: each token costs its steps plus its share of the transits), linear in d."""
    rt = _rt(0.2, 0.5, k_s=0.7, u_s=6.0, u_l=3.0)
    x0 = predict(LAT, rt, 1).tokens_per_s
    assert predict(LAT, rt, 1, handoff_delay_s=0.0) == predict(LAT, rt, 1)  # d = 0: the chain as it was
    d1, d2 = 0.004, 0.04
    p1, p2 = predict(LAT, rt, 1, handoff_delay_s=d1), predict(LAT, rt, 1, handoff_delay_s=d2)
    per_token_1, per_token_2 = 1 / p1.tokens_per_s - 1 / x0, 1 / p2.tokens_per_s - 1 / x0
    assert per_token_1 > 0 and math.isclose(per_token_2 / per_token_1, d2 / d1, rel_tol=1e-6)
    assert 0 < p1.in_transit < p2.in_transit < 1 and p2.handoff_delay_s == d2
    assert math.isclose(p2.per_token_latency_s, 1 / p2.tokens_per_s)  # Little's law, transit included


@pytest.mark.parametrize("C", [4, 16])
def test_a_longer_hand_off_leaves_fewer_requests_working(C):
    rt = _rt(0.15, 0.6)
    preds = [predict(LAT, rt, C, handoff_delay_s=d) for d in (0.0, 0.002, 0.02, 0.2)]
    xs, transit = [p.tokens_per_s for p in preds], [p.in_transit for p in preds]
    assert xs == sorted(xs, reverse=True) and transit == sorted(transit) and transit[0] == 0.0
    assert all(p.concurrency == C and math.isclose(p.per_token_latency_s, C / p.tokens_per_s) for p in preds)
    for p in preds[1:]:  # Little's law: in transit = hand-off rate x d, the rate of the requests still working
        assert 0 < p.in_transit < C
    chosen = choose_b(LAT, rt, C, handoff_delay_s=0.02, shared_device=1.0)
    b1 = predict(LAT, rt, C, handoff_delay_s=0.02, shared_device=1.0)
    assert chosen.handoff_delay_s == 0.02 and chosen.in_transit > 0
    assert chosen.baseline_tokens_per_s == b1.tokens_per_s <= chosen.tokens_per_s  # the best B, no worse than B = 1
    with pytest.raises(ValueError, match="handoff_delay_s"):
        predict(LAT, rt, C, handoff_delay_s=-1.0)


def test_bad_model_inputs_are_rejected():
    with pytest.raises(ValueError, match="RoutingStats.h"):
        RoutingStats(1.5)
    with pytest.raises(ValueError, match="LatencyModel.s"):
        LatencyModel(0.01, -1.0)
    with pytest.raises(ValueError, match="concurrency"):
        predict(LAT, _rt(0.1, 0.1), 0)


# ---- the engine --------------------------------------------------------------------------
def _specs(pair, **kw):
    base = {"dtype": "float64", "kv_cache_tokens": 4096, "block_size": 8, "max_num_batched_tokens": 128}
    base.update(kw)
    return {name: ModelSpec(path=path, **base) for name, path in pair.items()}


def test_profile_runs_in_the_worker_thread_and_is_cached(tiny_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    # the tiny pair's steps all cost about the same: whether the machine was busy is not under test here
    # (test_a_disordered_profile_is_measured_again_and_not_cached is), whether the profile is cached is
    monkeypatch.setattr(latency_profile, "DISORDER_SLACK", math.inf)
    policy = RStitch(tau=TINY_PAIR_TAU)
    threads = {}

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=policy, num_threads=1) as engine:
            profiles = await engine.profile()
            for name, prof in profiles.items():
                assert prof.source == "measured"
                assert prof.measured_in_thread == f"tokenrouter-worker-{name}"
                assert prof.path == tmp_path / "profiles" / f"{prof.key}.json" and prof.path.exists()
                lat = {(p.b, p.c): p.latency_s for p in prof.step_points}
                assert all(p.latency_s > 0 for p in prof.points)
                checks = {(p.b, p.t) for p in prof.points if p.t > 1}
                assert checks == {(b, t) for b in (1, 4, 16) for t in (2, 3, 5, 9)} - {(16, 9)}  # 144 > 128 tokens
                b_max = max(b for b, c in lat if c == 0)
                c_max = max(c for b, c in lat if b == 1)
                assert b_max == 32 and c_max == 127  # capped by max_num_batched_tokens=128
                # No comparison of two timings: on the tiny pair a step is ~10 ms of mostly fixed
                # overhead, and under load the 128-token prefill measured faster than one decode row
                # (11.6 ms against 11.9 ms in a CI run). What a profile measures is benchmarks' to judge.
                assert prof.fit.a > 0 and prof.fit.s >= 0 and prof.fit.k >= 0
                assert kv_blocks_in_use(workers_of(engine)[name]) == 0  # the profile's requests are gone
            assert engine.stats()["small"].steps == 0  # the profile is not counted as serving

            def no_measuring(*a, **kw):
                raise AssertionError("measured again")

            monkeypatch.setattr(latency_profile, "measure", no_measuring)
            again = await engine.profile()
            assert {n: p.source for n, p in again.items()} == {"small": "cache", "large": "cache"}
            assert {n: p.fit for n, p in again.items()} == {n: p.fit for n, p in profiles.items()}
            threads.update({n: p.key for n, p in again.items()})
            # at a CPU level pinned lower a step runs other kernels: its own profile, not this one
            level = native.cpu.current().level
            below = native.cpu.LEVELS[: native.cpu.LEVELS.index(level)]
            if below:
                worker = workers_of(engine)["large"]
                own = await anyio.to_thread.run_sync(worker.call(latency_profile.profile_info).result)
                with monkeypatch.context() as pin:
                    pin.setenv(native.cpu.ENV, below[-1])
                    pinned = await anyio.to_thread.run_sync(worker.call(latency_profile.profile_info).result)
                assert (own["cpu"]["cpu_level"], pinned["cpu"]["cpu_level"]) == (level, below[-1])
                assert latency_profile.profile_key(own) != latency_profile.profile_key(pinned)
        # a new engine on the same models reuses the cache too, from the start with "auto"
        async with Engine(models=_specs(tiny_pair), policy=policy, num_threads=1, delayed_batching="auto") as engine:
            profiles = engine.info().profiles
            assert {n: p.source for n, p in profiles.items()} == {"small": "cache", "large": "cache"}
            assert {n: p.key for n, p in profiles.items()} == threads

    anyio.run(main)


def test_profile_samples_round_robin_over_its_points(tiny_pair):
    """A burst of other work on the machine should slow one sample of many points (the fastest
    sample of each stands), not every sample of one point: the samples go round robin over the grid."""
    points = [(1, 0, 1), (2, 0, 1), (4, 0, 1), (1, 8, 1), (4, 8, 1), (2, 0, 3)]  # the cross, its corner, a check

    def measure(core):
        runs, forward = [], core.runner.forward

        def recording(batch):
            out = forward(batch)
            checked = tuple(len(logits) for _, logits in sorted(out.verify.items()))
            runs.append((batch.num_decode, tuple(batch.num_new), checked))
            return out

        core.runner.forward = recording
        try:
            prof = latency_profile.measure(
                core,
                batch_sizes=(1, 2, 4),
                catch_up_tokens=(0, 8),
                repeats=3,
                check_batch_sizes=(2,),
                check_tokens=(3,),
            )
        finally:
            core.runner.forward = forward
        return runs, prof, core.blocks.num_free == core.blocks.num_blocks

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), num_threads=1) as engine:
            return await anyio.to_thread.run_sync(workers_of(engine)["small"].call(measure).result)

    runs, prof, all_free = anyio.run(main)
    grid = [(p.b, p.c, p.t) for p in prof.points]
    assert sorted(grid) == sorted(points)

    def shape(b, c, t):  # decode rows and a catch-up row, or a check: b rows of t, logits at all t
        return (b, (1,) * b + ((c,) if c else ()), ()) if t == 1 else (0, (t,) * b, (t,) * b)

    one_round = [shape(*p) for p in grid]
    rounds = len(runs[2:]) // len(grid)  # 3, or 6 or 9 where the machine was busy (a disordered profile)
    assert rounds in (3, 6, 9) and runs[2:] == one_round * rounds  # after two warm-up runs: rounds over the grid
    assert all(len(p.samples) == rounds for p in prof.points)
    assert all(p.latency_s == min(p.samples) for p in prof.points)
    assert all_free


def test_disorder_names_a_smaller_step_that_cost_more():
    P = latency_profile.ProfilePoint
    calm = [P(1, 0, 0.050), P(2, 0, 0.046), P(4, 0, 0.049), P(1, 8, 0.090), P(4, 0, 0.17, t=5)]
    assert latency_profile.disorder(calm) == []  # within the slack: noise, not a busy machine
    busy = [P(1, 0, 1.95), P(2, 0, 0.046), P(1, 8, 0.089), P(4, 0, 0.17, t=5)]  # the demo 1.5B's cached profile
    found = latency_profile.disorder(busy)
    assert found and all(f.startswith("b=1 c=0 t=1 took 1950.0 ms") for f in found) and len(found) == 3
    assert latency_profile.disorder([P(1, 0, 0.2, t=3), P(4, 0, 0.1, t=1)]) == []  # not comparable: more rows


def test_a_disordered_profile_is_measured_again_and_not_cached(tiny_pair, monkeypatch, tmp_path):
    """A busy machine: the one-row step is slow while every other is not. Busy for the first rounds only,
    the retries find it fast (the fastest sample counts) and the profile is cached; busy throughout, it is
    used but not cached, and a disordered profile on disk is measured anew."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    slow_rounds = {"n": 0}

    def fake_step(rows, tokens_each=1, catch_up=0, context=64):
        if (rows, catch_up, tokens_each) == (1, 0, 1) and slow_rounds["n"] > 0:
            slow_rounds["n"] -= 1
            return 1.0
        return 0.01 * (rows * tokens_each + catch_up / 8)

    def measure(core, busy_for):
        slow_rounds["n"] = busy_for + 1  # + the warm-up run
        core.profile_step = fake_step  # this core only, in its own thread
        try:
            return latency_profile.measure(core, batch_sizes=(1, 2), catch_up_tokens=(0, 8), check_batch_sizes=())
        finally:
            del core.profile_step

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), num_threads=1) as engine:
            worker = workers_of(engine)["small"]
            briefly = await anyio.to_thread.run_sync(worker.call(lambda core: measure(core, 3)).result)
            throughout = await anyio.to_thread.run_sync(worker.call(lambda core: measure(core, 100)).result)
            return briefly, throughout

    briefly, throughout = anyio.run(main)
    assert briefly.disorder == [] and all(len(p.samples) == 6 for p in briefly.points)
    assert {(p.b, p.c): p.latency_s for p in briefly.points}[(1, 0)] == 0.01
    assert throughout.disorder and all(len(p.samples) == 9 for p in throughout.points)
    latency_profile.save(throughout)
    assert latency_profile.load_cached(throughout.info) is None  # on disk, but measured anew
    latency_profile.save(briefly)
    assert latency_profile.load_cached(briefly.info).points == briefly.points


def test_auto_delayed_batching_equals_no_delayed_batching(tiny_pair, monkeypatch, tmp_path, tokenizer):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    policy = RStitch(tau=TINY_PAIR_TAU)
    rng = random.Random(7)
    reqs = [
        ([rng.randrange(3, len(tokenizer)) for _ in range(rng.choice([3, 9, 20]))], rng.randint(8, 40))
        for _ in range(12)
    ]
    results = {}

    async def run(delayed_batching):
        outs = {}
        async with Engine(
            models=_specs(tiny_pair),
            policy=policy,
            num_threads=1,
            delayed_batching=delayed_batching,
            auto_batching=AutoBatchingOptions(
                interval_s=0.05, shared_device=1.0
            ),  # B may leave 1 when the model says so
        ) as engine:
            if delayed_batching == "auto":
                assert engine.throughput_prediction().tokens_per_s is None  # nothing observed yet

            async def one(i):
                prompt, n = reqs[i]
                outs[i] = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

            async with anyio.create_task_group() as tg:
                for i in range(len(reqs)):
                    tg.start_soon(one, i)
            await wait_all_free(engine)
            results[delayed_batching] = engine.throughput_prediction(refresh=True)
            stats = engine.stats()
            for st in stats.values():  # stats() carries the prediction and the B in force
                if delayed_batching is None:
                    assert st.throughput_prediction is None and st.batch_min == 1
                else:  # (the tuner may have re-picked since: a prediction, not necessarily that one)
                    assert st.throughput_prediction.tokens_per_s > 0 and st.batch_min >= 1
            auto_thread = next((t for t in threading.enumerate() if t.name == AUTO_THREAD), None)
        assert not any(t.name == AUTO_THREAD for t in threading.enumerate())
        if delayed_batching == "auto":
            assert auto_thread is not None and not auto_thread.is_alive()
        return outs

    plain = anyio.run(run, None)
    auto = anyio.run(run, "auto")
    for i in range(len(reqs)):
        assert auto[i].finish_reason == "length"
        assert auto[i].token_ids == plain[i].token_ids, i
        assert auto[i].token_models == plain[i].token_models, i
    assert results[None] is None
    pred = results["auto"]
    assert pred.tokens_per_s > 0 and pred.per_token_latency_s > 0
    assert 1 <= pred.concurrency <= len(reqs)
    assert set(pred.batch_min) == {"small", "large"} and all(b >= 1 for b in pred.batch_min.values())
    assert 0 < pred.routing["small"].h < 1 and pred.routing["small"].k < 1  # RStitch discards on the small model
    assert pred.routing["large"].k == 1.0
    assert list(pred.routing) == ["small", "large"]


@pytest.mark.parametrize("value", ["fast", "AUTO", "", 0, -1, True])
def test_bad_delayed_batching_is_a_config_error(tiny_model, value):
    with pytest.raises(ConfigError) as e:
        Engine(models={"m": tiny_model}, delayed_batching=value)
    assert str(e.value).startswith("delayed_batching"), str(e.value)
