"""Engine.metrics() and the Prometheus collector: values after a known workload (requests of
known lengths routed between two models, one of each finish reason), gauges while a worker is
frozen mid-request, calls from several event loops at once, and the exposition's names, types,
labels and values against docs/sdk.md's table."""

from __future__ import annotations

import asyncio
import bisect
import re
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import EveryK, StepGate, wait_all_free
from tokenrouter import LLM, Engine, ModelSpec, SamplingParams
from tokenrouter.metrics import LATENCY_BUCKETS, TTFT_BUCKETS, ModelMetrics, PrometheusCollector
from tokenrouter.testing import kv_blocks_in_use, kv_blocks_total, scheduler_queues, workers_of

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [3, 5, 7, 9]
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(len(LENGTHS))]


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


class FailsFor(EveryK):
    """EveryK(3), except that routing a step with request "boom" in it raises."""

    def route(self, result):
        if "boom" in result.request_ids:
            raise ZeroDivisionError("policy bug")
        return super().route(result)


def _specs(paths, **kw):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8, **kw) for n, p in paths.items()}


def _expected_buckets(bounds, xs) -> list[int]:
    counts = [0] * len(bounds)
    for x in xs:
        counts[bisect.bisect_left(bounds, x)] += 1
    return counts


def _scrape(source) -> str:
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(source))
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def workload(tiny_pair):
    """Run the known workload once; return what the test knows of each request and what the
    engine reported right after (snapshot and exposition)."""

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=FailsFor(3), num_threads=1) as engine:
            assert engine.metrics().requests == {"stop": 0, "length": 0, "abort": 0, "error": 0}
            outs = await engine.generate_batch(PROMPTS, [_greedy(n) for n in LENGTHS])  # 4 x length
            stop_at = outs[3].token_ids[4]
            stopped = await engine.generate(PROMPTS[3], _greedy(9, stop_token_ids=[stop_at]))  # stop
            async for first in engine.stream(PROMPTS[0], _greedy(200)):
                break  # leaving a stream early: abort
            failed = await engine.generate(PROMPTS[1], _greedy(5), request_id="boom")  # error
            await wait_all_free(engine)
            stats = engine.stats()
            return outs, stop_at, stopped, first, failed, engine.metrics(), _scrape(engine), stats

    outs, stop_at, stopped, first, failed, snapshot, exposition, stats = anyio.run(main)
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop_at
    assert failed.finish_reason == "error" and "policy bug" in failed.error
    return {
        "outs": outs,
        "stopped": stopped,
        "first": first,
        "failed": failed,
        "snapshot": snapshot,
        "exposition": exposition,
        "stats": stats,
    }


def test_values_after_a_known_workload(workload):
    outs, snap = workload["outs"], workload["snapshot"]
    ended = [*outs, workload["stopped"], workload["failed"]]  # and the left stream, whose output nobody saw
    assert snap.requests == {"stop": 1, "length": 4, "abort": 1, "error": 1}
    # EveryK(3): small writes tokens 1-3, large 4-6, small 7-9.
    assert [o.token_models for o in outs] == [(["small"] * 3 + ["large"] * 3 + ["small"] * 3)[:n] for n in LENGTHS]
    tokens = {"small": 16, "large": 8}
    for o in ended[4:]:
        for m, n in o.tokens_per_model().items():
            tokens[m] += n
    tokens[workload["first"].model] += len(workload["first"].token_ids)  # what the left stream had read
    assert snap.tokens_generated == tokens
    assert snap.handoffs == sum(o.num_handoffs for o in ended) > 0  # the left stream left before its first
    # Histograms: the outputs' own times, in the documented buckets, plus the left stream's one.
    for h, bounds, xs in [
        (snap.latency, LATENCY_BUCKETS, [o.latency for o in ended]),
        (snap.time_to_first_token, TTFT_BUCKETS, [o.time_to_first_token for o in ended if o.time_to_first_token]),
    ]:
        assert h.bounds == bounds and h.count == len(xs) + 1 == sum(h.counts)
        extra = [a - b for a, b in zip(h.counts, _expected_buckets(bounds, xs))]
        assert sorted(extra) == [0] * (len(bounds) - 1) + [1]
        assert h.sum >= sum(xs) - 1e-9
    # Once everything has ended, no KV is in use and nothing is queued; the pools are whole.
    for name, s in workload["stats"].items():
        assert snap.models[name] == ModelMetrics(0, s.kv_blocks_total, 0, 0, 0) and s.kv_blocks_total > 0


def test_prometheus_exposition_has_the_documented_names_and_the_snapshots_values(workload):
    snap, text = workload["snapshot"], workload["exposition"]
    got = _samples(text)

    def value(name, **labels):
        return got[(name, frozenset(labels.items()))]

    for reason, n in snap.requests.items():
        assert value("tokenrouter_requests_total", finish_reason=reason) == n
    for model, n in snap.tokens_generated.items():
        assert value("tokenrouter_generated_tokens_total", model=model) == n
    assert value("tokenrouter_handoffs_total") == snap.handoffs
    for name, h in [
        ("tokenrouter_time_to_first_token_seconds", snap.time_to_first_token),
        ("tokenrouter_request_latency_seconds", snap.latency),
    ]:
        buckets = {float(dict(labels)["le"]): v for (n, labels), v in got.items() if n == name + "_bucket"}
        assert buckets == dict(zip(h.bounds, h.cumulative()))
        assert value(name + "_count") == h.count and value(name + "_sum") == pytest.approx(h.sum)
    for model, m in snap.models.items():
        assert value("tokenrouter_kv_blocks_in_use", model=model) == m.kv_blocks_in_use == 0
        assert value("tokenrouter_kv_blocks_capacity", model=model) == m.kv_blocks_total
        for state in ("waiting", "running", "pending"):
            assert value("tokenrouter_worker_requests", model=model, state=state) == 0

    # Every documented metric is exposed with its type and labels, and nothing undocumented is.
    documented = {}
    for line in (ROOT / "docs" / "sdk.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`tokenrouter_"):
            documented[cells[1].strip("`")] = (cells[2], set(re.findall(r"`(\w+)`", cells[3])))
    assert len(documented) == 8
    exposed = {
        family.name + ("_total" if family.type == "counter" else ""): (
            family.type,
            {k for sample in family.samples for k in sample.labels} - {"le"},
        )
        for family in text_string_to_metric_families(text)
    }
    assert exposed == documented


def test_gauges_while_a_worker_is_frozen_mid_request(tiny_pair, tiny_model):
    """KV in use, running, waiting and pending-at-peer, read while a worker is frozen in a known state."""

    async def main():
        # One model, one batch slot, three requests: one running, two waiting.
        async with Engine(models=_specs({"m": tiny_model}, max_num_seqs=1), num_threads=1) as engine:
            w = workers_of(engine)["m"]
            gate = StepGate(w, lambda w: scheduler_queues(w) == (1, 2))  # (running, waiting)
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.generate_batch, [[1, 2, 3], [4, 5], [6]], _greedy(60))
                await gate.wait_hit()
                in_use = kv_blocks_in_use(w)
                assert in_use > 0
                assert engine.metrics().models["m"] == ModelMetrics(in_use, kv_blocks_total(w), 2, 1, 0)
                got = _samples(_scrape(engine))
                assert got[("tokenrouter_worker_requests", frozenset({"model": "m", "state": "waiting"}.items()))] == 2
                assert got[("tokenrouter_kv_blocks_in_use", frozenset({"model": "m"}.items()))] == in_use
                gate.open()
            await wait_all_free(engine)
            m = engine.metrics()
            assert (
                m.requests["length"] == 3 and m.tokens_generated == {"m": 180} and m.models["m"].kv_blocks_in_use == 0
            )

        # Two models: while "large" writes, "small" keeps the request parked (pending, KV kept).
        async with Engine(models=_specs(tiny_pair), policy=EveryK(3), num_threads=1) as engine:
            large = workers_of(engine)["large"]
            gate = StepGate(large, lambda w: scheduler_queues(w)[0] == 1)  # one running
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.generate, [1, 2, 3], _greedy(8))
                await gate.wait_hit()
                models = engine.metrics().models
                assert (models["small"].pending, models["small"].running, models["small"].waiting) == (1, 0, 0)
                assert (models["large"].pending, models["large"].running) == (0, 1)
                assert models["small"].kv_blocks_in_use > 0 and models["large"].kv_blocks_in_use > 0
                gate.open()
            await wait_all_free(engine)
            assert engine.metrics().handoffs >= 2

    anyio.run(main)


def test_requests_from_several_loops_at_once_are_all_counted(tiny_pair):
    errors: list = []

    async def batch(engine):
        with anyio.fail_after(120):  # a hang guard only
            await engine.generate_batch(PROMPTS * 2, _greedy(6))

    def in_thread(engine, run):
        try:
            run(batch, engine)
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=EveryK(3), num_threads=1) as engine:
            runs = [lambda f, e: asyncio.run(f(e)), trio.run, lambda f, e: asyncio.run(f(e))]
            threads = [threading.Thread(target=in_thread, args=(engine, run)) for run in runs]
            for t in threads:
                t.start()
            await batch(engine)
            for t in threads:
                await anyio.to_thread.run_sync(t.join, 120)
            return engine.metrics()

    m = anyio.run(main)
    assert not errors, errors
    n = 4 * 2 * len(PROMPTS)
    assert m.requests == {"stop": 0, "length": n, "abort": 0, "error": 0}
    assert m.tokens_generated == {"small": 3 * n, "large": 3 * n}
    assert m.latency.count == m.time_to_first_token.count == n


def test_an_llm_reports_its_engines_metrics(tiny_model):
    with LLM(models=_specs({"m": tiny_model}), num_threads=1) as llm:
        outs = llm.generate(PROMPTS, [_greedy(n) for n in LENGTHS])
        m = llm.metrics()
        assert m.requests["length"] == len(LENGTHS) and m.tokens_generated == {"m": sum(LENGTHS)}
        got = _samples(_scrape(llm))
        assert got[("tokenrouter_generated_tokens_total", frozenset({"model": "m"}.items()))] == sum(LENGTHS)
        assert got[("tokenrouter_request_latency_seconds_count", frozenset())] == len(outs)


def test_the_engine_does_not_import_prometheus_client():
    code = "import sys, tokenrouter, tokenrouter.metrics; assert 'prometheus_client' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
