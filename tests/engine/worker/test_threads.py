"""The engine's forwards run on the threads it chose, whatever the caller's threads set (issue 21):
torch copies its process-wide count into each thread lazily, so a worker that set nothing ran on
the count of a caller that had pinned itself to one thread."""

from __future__ import annotations

import threading

import anyio
import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import generate_all
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine import usable_cores
from tokenrouter.policies import RStitch
from tokenrouter.testing import wrap_forward

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[9 + i, 10, 11, 12] for i in range(4)]


def _specs(paths):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8) for n, p in paths.items()}


def _pin_caller_to_one_thread_elsewhere() -> None:
    """A request thread of a service pins torch to one thread while the engine runs."""
    t = threading.Thread(target=torch.set_num_threads, args=(1,))
    t.start()
    t.join()


def _steps_by_threads(engine) -> dict[str, dict[int, int]]:
    return {name: s.steps_by_threads for name, s in engine.stats().items()}


@pytest.mark.parametrize("models", ["one", "two"])
@pytest.mark.parametrize("num_threads", [None, 3])
def test_forwards_run_on_the_engines_threads_not_the_callers(tiny_pair, models, num_threads):
    expected = usable_cores() if num_threads is None else num_threads
    before = torch.get_num_threads()
    paths = {"small": tiny_pair["small"]} if models == "one" else tiny_pair
    policy = None if models == "one" else RStitch(tau=TINY_PAIR_TAU)

    async def main():
        torch.set_num_threads(1)  # the caller, before the engine starts
        async with Engine(models=_specs(paths), policy=policy, num_threads=num_threads) as e:
            await generate_all(e, PROMPTS, PARAMS)
            first = _steps_by_threads(e)
            torch.set_num_threads(1)  # ... and again after it has started, here and in another thread
            _pin_caller_to_one_thread_elsewhere()
            await generate_all(e, PROMPTS, PARAMS)
            second = _steps_by_threads(e)
            assert {s.torch_threads for s in e.stats().values()} == {expected}
        return first, second

    try:
        first, second = anyio.run(main)
    finally:
        torch.set_num_threads(before)
    for seen in (first, second):
        assert all(set(by_threads) == {expected} for by_threads in seen.values()), seen
    stepped = sum(n for by_threads in second.values() for n in by_threads.values())
    assert stepped > sum(n for by_threads in first.values() for n in by_threads.values())
    if models == "two":
        assert all(second[m] for m in ("small", "large")), "both models stepped"


def test_a_forward_restores_its_threads_if_its_thread_changed_them(tiny_pair):
    """Code running in a worker's own thread (a policy, a callback) may set torch's threads; the
    next forward runs on the engine's count again, and stats report what each step ran on."""
    before = torch.get_num_threads()

    def forward_after_pinning(forward, batch):
        torch.set_num_threads(1)  # in the worker's thread, right before its forward
        return forward(batch)

    async def main():
        async with Engine(models=_specs({"small": tiny_pair["small"]})) as e:
            wrap_forward(e, "small", forward_after_pinning)
            await generate_all(e, PROMPTS, PARAMS)
            return e.stats()["small"].steps_by_threads

    try:
        by_threads = anyio.run(main)
    finally:
        torch.set_num_threads(before)
    assert set(by_threads) == {usable_cores()}, by_threads
