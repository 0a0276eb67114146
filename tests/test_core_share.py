"""Workers on CPU share its cores (engine/core_share.py): a worker stepping alone takes them all,
busy workers settle on a fair split, and a fixed `num_threads` turns sharing off."""

from __future__ import annotations

import anyio
import pytest

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine.core_share import CoreShare, usable_cores
from tokenrouter.policies import RStitch

from .conftest import TINY_PAIR_TAU
from .helpers import wait_all_free


def test_claims_give_a_lone_worker_every_core_and_busy_ones_a_fair_split():
    share = CoreShare(cores=4, workers=2)
    assert share.fair_share == 2
    assert share.claim("small") == 4  # alone
    assert share.claim("large") == 1  # the other still holds all four until its step ends: at least one
    assert share.claim("small") == 3  # next step: what the other does not hold
    assert share.claim("large") == 1
    share.release("small")  # ran out of work
    assert share.claim("large") == 4
    assert share.claims() == {"large": 4}
    share.release("large")
    share.release("large")  # releasing twice is harmless
    assert share.claims() == {}


def test_three_workers_on_two_cores_each_get_at_least_one():
    share = CoreShare(cores=2, workers=3)
    assert share.fair_share == 1
    assert [share.claim(w) for w in ("a", "b", "c")] == [2, 1, 1]
    assert share.claim("a") == 1


def _specs(pair):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8) for n, p in pair.items()}


@pytest.mark.parametrize("num_threads", [None, 1])
def test_engine_shares_cores_unless_threads_are_fixed(tiny_pair, num_threads):
    cores = usable_cores()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), num_threads=num_threads) as e:
            one = await e.generate([5, 6, 7, 8], params)  # one request: one worker steps at a time
            assert one.num_handoffs > 0
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(e.generate, [9 + i, 10, 11], params)
            await wait_all_free(e)
            stats = e.stats()
            shares = {m: e.workers[m].core_share for m in e.workers}
            if num_threads is not None:
                assert set(shares.values()) == {None}
                assert all(s.steps_by_threads == {} for s in stats.values())
                assert {e.workers[m].torch_threads for m in e.workers} == {1}
                return
            share = shares["small"]
            assert share is not None and shares["large"] is share and share.claims() == {}  # all given back
            for s in stats.values():
                assert sum(s.steps_by_threads.values()) == s.steps
                assert all(1 <= t <= cores for t in s.steps_by_threads)
                assert e.workers[s.model].torch_threads == share.fair_share  # loaded (and profiled) at its share
            # every worker stepped alone at some point (the single request), so with all cores
            assert all(max(s.steps_by_threads) == cores for s in stats.values())

    anyio.run(main)


def test_single_model_and_lockstep_engines_share_nothing(tiny_pair):
    async def main():
        async with Engine(models={"small": _specs(tiny_pair)["small"]}) as e:
            assert e.workers["small"].core_share is None
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), mode="lockstep") as e:
            assert {w.core_share for w in e.workers.values()} == {None}

    anyio.run(main)
