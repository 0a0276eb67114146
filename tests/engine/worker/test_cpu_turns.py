"""Workers on CPU take turns (engine/worker/cpu_turns.py): first come first served, never two steps at
once, every forward (and every load) in the one compute thread, a stopping worker gives up waiting,
and a fixed `num_threads` turns all of it off."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import generate_all, wait_all_free, wait_until
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine import CoreShare, usable_cores
from tokenrouter.policies import RStitch
from tokenrouter.testing import workers_of


def test_turns_are_first_come_first_served():
    share = CoreShare(cores=2)
    assert share.take("a") and share.take("a")  # taking a held turn again is a no-op
    order: list[str] = []

    def wait_for_turn(name: str) -> None:
        assert share.take(name)
        order.append(name)
        share.give(name)

    waiters = []
    for name in ("b", "c"):
        t = threading.Thread(target=wait_for_turn, args=(name,))
        t.start()
        waiters.append(t)
        deadline = time.monotonic() + 5
        while name not in share.waiting() and time.monotonic() < deadline:
            time.sleep(0.001)
    assert share.waiting() == ["b", "c"] and share.holder == "a"
    share.give("c")  # not the holder: nothing happens
    assert share.holder == "a" and order == []
    share.give("a")
    for t in waiters:
        t.join(timeout=5)
    assert order == ["b", "c"] and share.holder is None and share.waiting() == []


def test_a_waiting_worker_gives_up_when_told_and_lets_the_next_go():
    share = CoreShare(cores=2)
    share.take("a")
    stop = threading.Event()
    result: dict[str, bool] = {}
    gave_up = threading.Thread(target=lambda: result.setdefault("b", share.take("b", give_up=stop.is_set)))
    gave_up.start()
    while "b" not in share.waiting():
        time.sleep(0.001)
    stop.set()
    gave_up.join(timeout=5)
    assert result == {"b": False} and share.waiting() == [] and share.holder == "a"
    share.give("a")
    assert share.take("c") and share.holder == "c"


def _specs(pair):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8) for n, p in pair.items()}


class NeverTogether:
    """Wraps each worker's forward to record whether two forwards ever overlapped."""

    def __init__(self, engine: Engine):
        self.lock = threading.Lock()
        self.inside = 0
        self.overlaps = 0
        self.forwards = 0
        self.threads: set[str] = set()
        for w in workers_of(engine).values():
            w.core.runner.execute = self._wrap(w.core.runner.execute)

    def _wrap(self, forward):
        def counted(batch):
            with self.lock:
                self.inside += 1
                self.forwards += 1
                self.overlaps += self.inside > 1
                self.threads.add(threading.current_thread().name)
            try:
                return forward(batch)
            finally:
                with self.lock:
                    self.inside -= 1

        return counted


@pytest.mark.parametrize("num_threads", [None, 1])
def test_engine_takes_turns_on_cpu_unless_threads_are_fixed(tiny_pair, num_threads):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), num_threads=num_threads) as e:
            seen = NeverTogether(e)
            outs = await generate_all(e, [[9 + i, 10, 11, 12] for i in range(8)], params)
            assert [len(o.token_ids) for o in outs] == [24] * 8
            await wait_all_free(e)
            stats = e.stats()
            assert sum(s.handoffs_received for s in stats.values()) > 0
            shares = {workers_of(e)[m].core_share for m in workers_of(e)}
            if num_threads is not None:
                assert shares == {None} and {w.core.torch_threads for w in workers_of(e).values()} == {1}
                assert seen.threads == {"tokenrouter-worker-small", "tokenrouter-worker-large"}
                assert all(s.time_waiting_for_cores_s == 0 for s in stats.values())
                return
            (share,) = shares
            assert share is not None
            # Every turn is given back. A worker reports a step's events (the caller's requests end,
            # their KV already freed) before it gives up its turn, so wait for that last step to end.
            await wait_until(lambda: share.holder is None and share.waiting() == [], what="every turn given back")
            assert {w.core.torch_threads for w in workers_of(e).values()} == {usable_cores()}  # each step on every core
            assert seen.forwards > 10 and seen.overlaps == 0
            assert seen.threads == {"tokenrouter-cpu-compute"}  # one OpenMP team for every forward

    anyio.run(main)


def test_single_model_and_lockstep_engines_take_no_turns(tiny_pair):
    async def main():
        async with Engine(models={"small": _specs(tiny_pair)["small"]}) as e:
            assert workers_of(e)["small"].core_share is None
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), mode="lockstep") as e:
            assert {w.core_share for w in workers_of(e).values()} == {None}

    anyio.run(main)


def test_stopping_engine_does_not_wait_for_a_turn(tiny_pair):
    """close() while requests are in flight on both workers ends promptly and frees everything."""
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        e = Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU))
        await e.start()
        results = []

        async def one(i):
            results.append(await e.generate([20 + i, 21, 22], params))

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)
            await anyio.sleep(0.5)
            t0 = time.monotonic()
            await e.close()
            assert time.monotonic() - t0 < 10
        assert len(results) == 6 and all(r.finish_reason in ("abort", "length") for r in results)

    anyio.run(main)


def test_models_load_in_the_compute_thread_where_they_take_turns(tiny_pair, monkeypatch):
    """Loading computes on every core too (the probe, the repacking): in the compute thread, so no
    worker's thread keeps an OpenMP team of its own (engine/worker/cpu_turns.py says what that cost)."""
    from tokenrouter.engine.model_core import ModelCore

    where: dict[str, tuple[str, bool]] = {}
    real = ModelCore.load

    def load(self, *args, **kwargs):
        where[self.name] = (threading.current_thread().name, torch.is_inference_mode_enabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ModelCore, "load", load)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU)):
            pass
        assert where == {"small": ("tokenrouter-cpu-compute", False), "large": ("tokenrouter-cpu-compute", False)}
        where.clear()
        async with Engine(models=_specs(tiny_pair), policy=RStitch(tau=TINY_PAIR_TAU), num_threads=1):
            pass  # fixed threads: each worker loads and steps in its own thread
        assert where == {"small": ("tokenrouter-worker-small", False), "large": ("tokenrouter-worker-large", False)}

    anyio.run(main)


def test_the_compute_thread_runs_a_job_posted_from_itself_at_once():
    share = CoreShare(2)
    share.start()
    try:
        inner = lambda: (threading.current_thread().name, torch.is_inference_mode_enabled())  # noqa: E731
        assert share.run(lambda: share.run(inner)) == ("tokenrouter-cpu-compute", True)
        assert share.run(lambda: share.run(inner, inference_mode=False)) == ("tokenrouter-cpu-compute", False)
    finally:
        share.stop()
