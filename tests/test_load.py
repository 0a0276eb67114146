"""Load: 1,000 requests at once and 200 more trickling in, across two routed models with small KV
pools (so requests are preempted and pending ones evicted). Every request ends exactly once, a
sample equals the reference, and every pool ends free. The soak variant (marked slow) checks
that memory holds steady over 10,000 requests."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import anyio
import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import holds_nothing, wait_all_free
from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams
from tokenrouter.testing import load_reference_models, reference_generate, workers_of

POLICY = RStitch(tau=TINY_PAIR_TAU)


def _workload(n: int, seed: int, vocab: int = 380) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, vocab) for _ in range(rng.randint(2, 14))],
            SamplingParams(temperature=0, max_tokens=rng.randint(2, 8), ignore_eos=True),
        )
        for _ in range(n)
    ]


def _engine(pair, kv_tokens: int) -> Engine:
    spec = {"dtype": "float64", "kv_cache_tokens": kv_tokens, "block_size": 8, "max_num_batched_tokens": 256}
    return Engine(models={n: ModelSpec(path=p, **spec) for n, p in pair.items()}, policy=POLICY, num_threads=1)


def _count_worker_ends(engine) -> Counter:
    """Terminal events per request, as the workers send them."""
    ends: Counter = Counter()
    workers = workers_of(engine)
    dispatch = next(iter(workers.values())).sink  # the engine's own: every worker delivers there

    def counting(events):
        for ev in events:
            if ev.finish_reason is not None:
                ends[ev.request_id] += 1
        dispatch(events)

    for worker in workers.values():
        worker.sink = counting
    return ends


async def _run(engine, work, rid_prefix: str, outs: dict, last_deltas: Counter) -> None:
    async def one(i, prompt, params):
        rid = f"{rid_prefix}{i}"
        async for delta in engine.stream(prompt, params, request_id=rid):
            assert last_deltas[rid] == 0, f"{rid}: a delta after the last one"
            if delta.finish_reason is not None:
                last_deltas[rid] += 1
                outs[rid] = delta.output

    async with anyio.create_task_group() as tg:
        for i, (prompt, params) in enumerate(work):
            tg.start_soon(one, i, prompt, params)


def test_1000_at_once_and_200_trickling(tiny_pair):
    burst, trickle = _workload(1000, seed=1), _workload(200, seed=2)
    outs: dict = {}
    last_deltas: Counter = Counter()

    async def main():
        async with _engine(tiny_pair, kv_tokens=256) as engine:
            ends = _count_worker_ends(engine)

            async def trickling():
                for i, item in enumerate(trickle):
                    await anyio.sleep(0.002)
                    tg.start_soon(_run, engine, [item], f"t{i}-", outs, last_deltas)

            async with anyio.create_task_group() as tg:
                tg.start_soon(_run, engine, burst, "b", outs, last_deltas)
                tg.start_soon(trickling)
            await wait_all_free(engine)
            assert holds_nothing(engine)
            stats = engine.stats()
            return ends, stats

    ends, stats = anyio.run(main)
    assert len(outs) == 1200
    assert set(last_deltas.values()) == {1}  # every stream ended exactly once
    assert len(ends) == 1200 and set(ends.values()) == {1}  # and every request ended once in the workers
    assert all(o.finish_reason == "length" for o in outs.values())
    assert sum(s.preemptions + s.evictions for s in stats.values()) > 0, "the pools were meant to be too small"
    assert stats["large"].handoffs_received > 100

    models = load_reference_models(tiny_pair, torch.float64)
    rng = random.Random(0)
    sample = [(f"b{i}", burst[i]) for i in rng.sample(range(1000), 12)]
    sample += [(f"t{i}-0", trickle[i]) for i in rng.sample(range(200), 4)]
    for rid, (prompt, params) in sample:
        ref = reference_generate(POLICY, models, prompt, params)
        assert outs[rid].token_ids == ref.token_ids, rid
        assert outs[rid].token_models == ref.token_models, rid


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_soak_memory_holds_steady(tiny_pair):
    """10,000 requests in waves of 500: after two warm-up waves, RSS grows by less than 5%."""
    import gc

    rss: list[int] = []

    async def main():
        async with _engine(tiny_pair, kv_tokens=512) as engine:
            for wave in range(20):
                outs: dict = {}
                last: Counter = Counter()
                await _run(engine, _workload(500, seed=100 + wave), f"w{wave}-", outs, last)
                assert len(outs) == 500 and set(last.values()) == {1}
                await wait_all_free(engine)
                assert holds_nothing(engine)
                gc.collect()
                rss.append(_rss_bytes())

    anyio.run(main)
    warm, end = rss[1], rss[-1]
    growth = (end - warm) / warm
    print(
        f"RSS after warm-up {warm / 2**20:.1f} MiB, after 10,000 requests {end / 2**20:.1f} MiB ({100 * growth:+.2f}%)"
    )
    assert growth < 0.05, [f"{r / 2**20:.1f}" for r in rss]
