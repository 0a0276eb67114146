"""Faults with workers in Ray actors: an actor killed in the middle of a run, a worker thread
that dies inside a live actor. The requests it held end with an error naming the worker, within
a bounded time (the bound is a hang guard, not a measurement); its peer frees its pending
copies; `health()` names it; new requests are refused at once; closing does not hang and leaves
the cluster running; a new engine on the same cluster serves again; the actors' processes are
gone once the engine has closed."""

from __future__ import annotations

import os

import anyio
import pytest
import torch

from tests.helpers import EveryK, RemoteStepGate, generate_all, wait_until
from tests.ray_processes import wait_gone
from tokenrouter import Engine, EngineNotRunningError, ModelSpec, RayPlacement, SamplingParams
from tokenrouter.engine import SeqStatus
from tokenrouter.testing import break_scheduler, live_sequences, load_reference_models, reference_generate, workers_of

POLICY = EveryK(3)
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(6)]
PLACE = {"small": RayPlacement(resources={"node_small": 1}), "large": RayPlacement(resources={"node_large": 1})}


@pytest.fixture(scope="module")
def refs(tiny_pair):
    models = load_reference_models(tiny_pair, torch.float64)
    return [reference_generate(POLICY, models, p, PARAMS) for p in PROMPTS]


def _engine(pair):
    specs = {
        n: ModelSpec(path=p, placement=PLACE[n], dtype="float64", kv_cache_tokens=1024, block_size=8)
        for n, p in pair.items()
    }
    return Engine(models=specs, policy=POLICY, num_threads=1, stop_timeout=10)


def _pid(worker) -> int:
    return os.getpid()


def _running_here(worker) -> bool:
    return any(s.status is SeqStatus.RUNNING for s in live_sequences(worker).values())


def _small_holds_nothing(engine) -> bool:
    s = engine.stats()["small"]
    return s.running == s.waiting == s.pending == 0 and s.kv_blocks_free == s.kv_blocks_total


async def _generate_all(engine, rids):
    """PROMPTS[i] as request rids[i], all at once: the outputs by id."""
    return dict(zip(rids, await generate_all(engine, PROMPTS[: len(rids)], PARAMS, request_ids=rids)))


def test_killing_the_large_models_actor_mid_run_fails_its_requests_and_nothing_hangs(ray_cluster, tiny_pair):
    import ray

    async def main():
        engine = _engine(tiny_pair)
        await engine.start()
        pids = {name: w.inspect(_pid) for name, w in workers_of(engine).items()}
        large = workers_of(engine)["large"]
        gate = RemoteStepGate(large, _running_here)  # freeze the large model with requests in it
        outs = {}
        async with anyio.create_task_group() as tg:

            async def run():
                outs.update(await _generate_all(engine, [f"r{i}" for i in range(len(PROMPTS))]))

            tg.start_soon(run)
            await gate.wait_hit()
            ray.kill(large.handle, no_restart=True)  # the actor dies in the middle of a step
            with anyio.fail_after(60):  # a hang guard, not a timing: the requests must end
                while len(outs) < len(PROMPTS):
                    await anyio.sleep(0.02)
        for rid, out in outs.items():
            assert out.finish_reason == "error", rid
            assert "worker 'large' died" in out.error, out.error
        health = engine.health()
        assert not health.healthy and health.running
        assert health.workers["small"] == "ok"
        assert health.workers["large"].startswith("worker 'large' died: its Ray actor was lost")
        await wait_until(lambda: _small_holds_nothing(engine), 30, "the small model's pending copies freed")
        with pytest.raises(EngineNotRunningError, match="worker 'large' is not running .*died"):
            await engine.generate(PROMPTS[0], PARAMS)  # at once, not a hang
        with anyio.fail_after(60):
            await engine.close()
        assert engine.health().workers == {"small": "stopped", "large": "stopped"}
        return pids

    pids = anyio.run(main)
    assert not wait_gone({pid: name for name, pid in pids.items()}, timeout=60), "an actor's process outlived close()"
    assert ray.is_initialized() and len([n for n in ray.nodes() if n["Alive"]]) == 2  # the cluster runs on


def test_a_new_engine_on_the_same_cluster_serves_then_a_dead_worker_thread_fails_its_requests(
    ray_cluster, tiny_pair, refs
):
    async def main():
        async with _engine(tiny_pair) as engine:
            outs = await _generate_all(engine, ["a", "b"])
            assert [outs["a"].token_ids, outs["b"].token_ids] == [refs[0].token_ids, refs[1].token_ids]
            assert [outs["a"].token_models, outs["b"].token_models] == [refs[0].token_models, refs[1].token_models]
            # the actor lives on; the large model's stepping thread dies once it has work
            break_scheduler(engine, "large", RuntimeError("injected: scheduler bug"))
            with anyio.fail_after(60):
                outs = await _generate_all(engine, ["c", "d", "e"])  # each moves to the large model after 3 tokens
            for out in outs.values():
                assert out.finish_reason == "error"
                assert "worker 'large' died: RuntimeError: injected: scheduler bug" in out.error
            health = engine.health()
            assert not health.healthy and health.workers["small"] == "ok"
            assert health.workers["large"].startswith("worker 'large' died: RuntimeError")
            await wait_until(lambda: _small_holds_nothing(engine), 30, "the small model's pending copies freed")
            with pytest.raises(EngineNotRunningError, match="worker 'large' is not running"):
                await engine.generate(PROMPTS[0], PARAMS)

    anyio.run(main)


def test_batches_sent_once_a_worker_is_down_say_so():
    """A request refused after an actor's worker died ends with the worker's error. The batch that
    carries that end must say the worker is down, so that a caller who sees the request fail
    finds `health()` saying so too. Before, only the final batch said it, and a refusal could
    arrive first (a fresh-clone run saw health() healthy after its requests had failed)."""
    from tokenrouter.distributed import wire
    from tokenrouter.distributed.caller_queue import CallerQueue
    from tokenrouter.engine import WorkerEvent

    class Channel:  # the direct channel's interface, keeping what was sent
        usable = True

        def __init__(self):
            self.sent = []

        def send(self, data: bytes) -> bool:
            self.sent.append(wire.loads(data))
            return True

    queue = CallerQueue("large")
    queue.channel = Channel()

    def end(request_id: str, error: str | None) -> None:
        queue.stage_events(
            [wire.NumberedEvent(WorkerEvent(request_id, [], "large", finish_reason="error", error=error), 0)]
        )
        queue.publish()

    end("a", None)
    queue.mark_down("worker 'large' died: RuntimeError: boom")
    end("b", "worker 'large' died: RuntimeError: boom")
    first, second = queue.channel.sent
    assert (first.alive, first.error) == (True, None)
    assert (second.alive, second.error) == (False, "worker 'large' died: RuntimeError: boom") and not second.stopped
