"""Faults: an exception in a forward, in building a request's output, a worker thread dying, a
worker that will not stop. Affected requests fail with the cause; the others go on; a dead
worker makes the engine unhealthy and new requests get a clear error at once; the engine can be
closed and started again in the same process; closing never hangs."""

from __future__ import annotations

import logging
import threading
import time

import anyio
import pytest
import torch

from tests.helpers import EveryK, generate_all, holds_nothing, wait_all_free
from tokenrouter import Engine, EngineNotRunningError, ModelSpec, SamplingParams
from tokenrouter.api import output_processor
from tokenrouter.testing import (
    break_scheduler,
    fail_forward,
    live_sequences,
    load_reference_models,
    reference_generate,
    workers_of,
    wrap_forward,
)

POLICY = EveryK(3)
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(6)]


@pytest.fixture(scope="module")
def refs(tiny_pair):
    models = load_reference_models(tiny_pair, torch.float64)
    return [reference_generate(POLICY, models, p, PARAMS) for p in PROMPTS]


def _engine(pair, **kw):
    specs = {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=1024, block_size=8) for n, p in pair.items()}
    return Engine(models=specs, policy=POLICY, num_threads=1, **kw)


async def _generate_all(engine, rids):
    """PROMPTS[i] as request rids[i], all at once: the outputs by id."""
    return dict(zip(rids, await generate_all(engine, PROMPTS[: len(rids)], PARAMS, request_ids=rids)))


def test_a_failed_forward_fails_its_batch_only(tiny_pair, refs):
    async def main():
        async with _engine(tiny_pair) as engine:
            error = RuntimeError("injected: CUDA error: an illegal memory access")
            fired = fail_forward(engine, "large", error, when=lambda request_ids: "boom" in request_ids)
            outs = await _generate_all(engine, ["boom", "a", "b"])
            await wait_all_free(engine)
            assert holds_nothing(engine)
            failed = set(fired[0])
            assert "boom" in failed
            for i, rid in enumerate(["boom", "a", "b"]):
                if rid in failed:
                    assert outs[rid].finish_reason == "error"
                    assert "step failed: RuntimeError: injected: CUDA error" in outs[rid].error
                else:
                    assert outs[rid].token_ids == refs[i].token_ids
            assert engine.health().healthy  # a failed step does not kill the worker
            again = await engine.generate(PROMPTS[0], PARAMS)
            assert again.token_ids == refs[0].token_ids

    anyio.run(main)


def test_a_failure_building_the_output_fails_that_request_only(tiny_pair, refs, monkeypatch):
    real_init = output_processor.OutputProcessor.__init__

    def init(self, tokenizer, req):
        real_init(self, tokenizer, req)
        if req.request_id == "boom":

            def add(ids):
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

            self.detok.add = add

    monkeypatch.setattr(output_processor.OutputProcessor, "__init__", init)

    async def main():
        async with _engine(tiny_pair) as engine:
            outs = await _generate_all(engine, ["boom", "a", "b"])
            assert outs["boom"].finish_reason == "error"
            assert "building the output failed: UnicodeDecodeError" in outs["boom"].error
            assert outs["a"].token_ids == refs[1].token_ids and outs["b"].token_ids == refs[2].token_ids
            async for delta in engine.stream(PROMPTS[0], PARAMS, request_id="boom"):
                pass  # a stream ends with the error on its last delta
            assert delta.finish_reason == "error" and delta.output.finish_reason == "error"
            await wait_all_free(engine)
            assert holds_nothing(engine)

    anyio.run(main)


def test_a_dead_worker_fails_its_requests_and_the_engine_restarts(tiny_pair, refs):
    async def main():
        engine = _engine(tiny_pair)
        await engine.start()
        break_scheduler(engine, "large", RuntimeError("injected: scheduler bug"))  # its loop breaks once it has work
        outs = await _generate_all(engine, ["a", "b", "c"])  # each moves to the large model after 3 tokens
        for out in outs.values():
            assert out.finish_reason == "error"
            assert "worker 'large' died: RuntimeError: injected: scheduler bug" in out.error
        health = engine.health()
        assert not health.healthy and health.running
        assert health.workers["small"] == "ok"
        assert health.workers["large"].startswith("worker 'large' died: RuntimeError")
        await wait_all_free(engine)  # the pending copies on the small model are released too
        assert not live_sequences(workers_of(engine)["small"])
        with pytest.raises(EngineNotRunningError, match="worker 'large' is not running .*died"):
            await engine.generate(PROMPTS[0], PARAMS)  # at once, not a hang
        await engine.close()
        assert engine.health().workers == {"small": "stopped", "large": "stopped"}
        await engine.start()
        assert engine.health().healthy
        outs = await _generate_all(engine, ["a", "b"])
        assert [outs["a"].token_ids, outs["b"].token_ids] == [refs[0].token_ids, refs[1].token_ids]
        await engine.close()

    anyio.run(main)


def test_closing_never_hangs_on_a_stuck_worker(tiny_pair, caplog):
    release = threading.Event()

    async def main():
        engine = _engine(tiny_pair, stop_timeout=0.3)
        await engine.start()
        entered = threading.Event()

        def stuck(forward, batch):
            entered.set()
            release.wait(20)  # stuck, e.g. in a kernel that never returns
            return forward(batch)

        wrap_forward(engine, "large", stuck)
        result = {}

        async def victim():
            result["out"] = await engine.generate(PROMPTS[0], PARAMS)

        with anyio.fail_after(15):  # a broken promise fails the test instead of hanging it
            async with anyio.create_task_group() as tg:
                tg.start_soon(victim)
                assert await anyio.to_thread.run_sync(entered.wait, 10)
                t0 = time.monotonic()
                await engine.close()
                closed_in = time.monotonic() - t0
        assert closed_in < 5  # the stop timeout plus scheduling slack, not the stuck forward's 20 s
        assert result["out"].finish_reason == "abort"
        assert "stuck" in result["out"].error
        assert engine.health().workers["large"].startswith("stuck")
        assert "did not stop within 0.3 s" in caplog.text

    with caplog.at_level(logging.ERROR, logger="tokenrouter.api.engine"):
        try:
            anyio.run(main)
        finally:
            release.set()


@pytest.mark.parametrize("error", [None, "worker 'large' died: RuntimeError: injected"])
def test_a_hand_off_left_in_the_inbox_of_a_stopping_worker_ends_as_its_requests_do(tiny_model, error):
    """A hand-off that reaches a worker after its loop broke (drained while it shuts down) ends
    with the worker's error, as the requests it held do; only a worker stopped on purpose ends
    it as aborted. A fresh-clone run saw one such request end "abort" beside others ending
    "error" for the same death."""
    from tokenrouter.engine import ModelCore, Outbox, Request
    from tokenrouter.policies import PeerMessage, Single

    core = ModelCore("large", ModelSpec(path=tiny_model), Single("large"))  # never loaded: refusing needs none
    req = Request("r", [5, 6, 7], SamplingParams(max_tokens=4), 0, frozenset(), 4)
    out = Outbox()
    core.receive(PeerMessage("r", "small", "large", [8], start=3), req, out, refuse=True, error=error)
    (event,) = out.events
    assert (event.finish_reason, event.error) == (("abort", None) if error is None else ("error", error))
    assert out.releases == ["r"] and not core.seqs
