"""Models in Ray actors (docs/distributed.md), on a local cluster of two simulated nodes
(conftest's `ray_cluster`): each model's actor pinned to its own node by a custom resource.

The same API as in one process: routed greedy output equals the in-process engine's and the
reference (tokens and writers) under 16 concurrent requests, streaming, asyncio and trio
callers, statistics and health from the actors; a learned router's weights travel to the actor
and its policy runs there, with the small model in the caller's process and the large one in an
actor; delayed_batching="auto" profiles each model in its actor and counts the measured hand-off
delay; placement that the cluster cannot hold fails at start, naming what is missing, with no
actor left waiting; ray_address="local" starts Ray for the engine and stops it at close."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
import torch

from tests.conftest import LARGE_NODE, SMALL_NODE
from tests.helpers import EveryK, actor_node, generate_all, holds_nothing_anywhere, wait_all_free
from tests.policies.test_learned_policies import make_router
from tokenrouter import ConfigError, Engine, ModelSpec, RayPlacement, SamplingParams
from tokenrouter.policies import CITER
from tokenrouter.testing import load_reference_models, reference_generate, workers_of

POLICY = EveryK(3)
PARAMS = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
PLACE = {
    "small": RayPlacement(num_cpus=1, resources={"node_small": 1}),
    "large": RayPlacement(num_cpus=1, resources={"node_large": 1}),
}


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 380) for _ in range(rng.randint(2, 30))] for _ in range(n)]


def specs(pair, placed=("small", "large"), **kw):
    base = {"dtype": "float64", "kv_cache_tokens": 2048, "block_size": 8, "max_num_batched_tokens": 64} | kw
    return {n: ModelSpec(path=p, placement=PLACE[n] if n in placed else None, **base) for n, p in pair.items()}


@pytest.fixture(scope="module")
def engine(ray_cluster, tiny_pair, tmp_path_factory):
    """Both models in actors, on their own nodes, in one STRICT_SPREAD placement group, with
    delayed_batching="auto" (each model profiled in its actor; the profiles cached here)."""
    home = os.environ.get("TOKENROUTER_HOME")
    os.environ["TOKENROUTER_HOME"] = str(tmp_path_factory.mktemp("home"))
    e = Engine(
        models=specs(tiny_pair),
        policy=POLICY,
        num_threads=1,
        placement_strategy="STRICT_SPREAD",
        delayed_batching="auto",
        auto_batching={"interval_s": 0.2},
    )
    try:
        anyio.run(e.start)
        yield e
        anyio.run(e.close)
    finally:
        if home is None:
            os.environ.pop("TOKENROUTER_HOME", None)
        else:
            os.environ["TOKENROUTER_HOME"] = home


@pytest.fixture(scope="module")
def ref_models(tiny_pair):
    return load_reference_models(tiny_pair, torch.float64)


def test_each_model_runs_in_an_actor_on_its_own_node(engine, ray_cluster):
    import ray

    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    small, large = (workers_of(engine)[m].inspect(actor_node) for m in ("small", "large"))
    assert small != large
    assert set(SMALL_NODE) <= set(nodes[small]) and set(LARGE_NODE) <= set(nodes[large])
    assert engine.health().healthy and engine.health().workers == {"small": "ok", "large": "ok"}


def test_routed_greedy_equals_in_process_engine_and_reference(engine, tiny_pair, ref_models):
    prompts = _prompts(16, seed=3)

    async def in_process():
        async with Engine(models=specs(tiny_pair, placed=()), policy=POLICY, num_threads=1) as local:
            return await generate_all(local, prompts, PARAMS)

    async def remote():
        await engine.reset_prefix_cache()  # as fresh as the in-process engine (in both actors)
        outs = await generate_all(engine, prompts, PARAMS)  # 16 at once
        await wait_all_free(engine)  # KV free in both actors
        return outs

    outs = anyio.run(remote)
    local = anyio.run(in_process)
    assert holds_nothing_anywhere(engine)
    for i, p in enumerate(prompts):
        ref = reference_generate(POLICY, ref_models, p, PARAMS)
        assert outs[i].token_ids == local[i].token_ids == ref.token_ids, i
        assert outs[i].token_models == local[i].token_models == ref.token_models, i
        assert outs[i].num_handoffs == ref.num_handoffs > 0, i
        assert outs[i].tokens_processed == local[i].tokens_processed, i  # KV kept across hand-offs, as in one process
    stats = engine.stats()
    assert all(s.handoffs_sent > 0 and s.time_transport_s > 0 for s in stats.values())
    assert max(max(s.batch_size_histogram) for s in stats.values()) > 1, "requests were never batched together"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_streaming_from_asyncio_and_trio(engine, ref_models, backend):
    prompt = _prompts(1, seed=11)[0]
    ref = reference_generate(POLICY, ref_models, prompt, PARAMS)

    async def main():
        tokens, models, last = [], [], None
        async for delta in engine.stream(prompt, PARAMS):
            tokens += delta.token_ids
            models += [delta.model] * len(delta.token_ids)
            last = delta
        out = await engine.generate(prompt, PARAMS)
        await wait_all_free(engine)
        return tokens, models, last, out

    tokens, models, last, out = anyio.run(main, backend=backend)
    assert tokens == out.token_ids == ref.token_ids
    assert models == out.token_models == ref.token_models
    assert last.finish_reason == "length" and last.output.token_ids == ref.token_ids


def test_stats_metrics_and_measured_transport(engine):
    metrics = engine.metrics()
    assert set(metrics.models) == {"small", "large"}
    for name, worker in workers_of(engine).items():
        assert 0 < worker.handoff_delay_s < 1.0, name  # measured at start: half a round trip between the actors
        s = engine.stats()[name]
        assert s.alive and s.kv_blocks_free == s.kv_blocks_total
    assert len({worker.host for worker in workers_of(engine).values()}) == 1  # two Ray nodes, one machine


def test_auto_delayed_batching_profiles_in_the_actors_and_counts_the_hand_off_delay(engine):
    assert {p.measured_in_thread for p in engine.info().profiles.values()} == {
        "tokenrouter-worker-small",
        "tokenrouter-worker-large",
    }
    prompts = _prompts(8, seed=31)
    anyio.run(generate_all, engine, prompts, PARAMS)  # traffic for the controller to observe
    prediction = engine.throughput_prediction(refresh=True)
    assert set(prediction.batch_min) == {"small", "large"} and prediction.tokens_per_s > 0
    delay = sum(w.handoff_delay_s for w in workers_of(engine).values()) / 2
    assert prediction.handoff_delay_s == delay > 0 and prediction.in_transit > 0
    anyio.run(wait_all_free, engine)


def _channels_off(worker) -> None:
    """Send everything by Ray calls, as when an actor cannot reach its peers' or caller's port."""
    from tokenrouter.distributed.links import PeerLink

    worker.test_channels = (
        worker.queue.channel,
        {n: p.link.channel for n, p in worker.peers.items() if isinstance(p, PeerLink)},
    )
    worker.queue.channel = None
    for n in worker.test_channels[1]:
        worker.peers[n].link.channel = None


def _channels_on(worker) -> None:
    worker.queue.channel, links = worker.test_channels
    for n, channel in links.items():
        worker.peers[n].link.channel = channel
    del worker.test_channels


def test_without_the_direct_channels_everything_goes_by_ray_calls_with_the_same_output(engine, ref_models):
    prompts = _prompts(6, seed=41)
    for worker in workers_of(engine).values():
        worker.inspect(_channels_off)

    async def main():
        with anyio.fail_after(60):  # a hang guard
            outs = await generate_all(engine, prompts, PARAMS)
            await wait_all_free(engine)
            return outs

    try:
        outs = anyio.run(main)
    finally:
        for worker in workers_of(engine).values():
            worker.inspect(_channels_on)
    for i, p in enumerate(prompts):
        ref = reference_generate(POLICY, ref_models, p, PARAMS)
        assert outs[i].token_ids == ref.token_ids and outs[i].token_models == ref.token_models, i


def test_a_learned_router_travels_to_its_actor_with_the_small_model_in_process(ray_cluster, tiny_pair, ref_models):
    """CITER's router (weights and all) is sent to the actors once; the small model stays in the
    caller's process and hands off to the large one in an actor; the output is the reference's."""
    policy = CITER(make_router("citer", ref_models))
    prompts = _prompts(8, seed=21)

    async def main():
        async with Engine(models=specs(tiny_pair, placed=("large",)), policy=policy, num_threads=1) as e:
            kinds = {name: type(worker).__name__ for name, worker in workers_of(e).items()}
            assert kinds == {"large": "RemoteWorker", "small": "LinkedWorker"}
            outs = await generate_all(e, prompts, PARAMS)
            await wait_all_free(e)
            return outs

    outs = anyio.run(main)
    moved = 0
    for i, p in enumerate(prompts):
        ref = reference_generate(policy, ref_models, p, PARAMS)
        assert outs[i].token_ids == ref.token_ids and outs[i].token_models == ref.token_models, i
        moved += ref.num_handoffs
    assert moved > 8, "the router was meant to defer tokens to the large model"


def test_placement_the_cluster_cannot_hold_fails_at_start_naming_it(ray_cluster, tiny_pair):
    import ray

    nowhere = dict(specs(tiny_pair))
    nowhere["large"] = nowhere["large"].model_copy(update={"placement": RayPlacement(resources={"node_huge": 1})})
    together = Engine(models=specs(tiny_pair), policy=POLICY, placement_strategy="STRICT_PACK")
    cases = [
        (Engine(models=nowhere, policy=POLICY), "models['large'].placement: no node of the Ray cluster has"),
        (together, "placement_strategy: STRICT_PACK needs one node with"),  # each wants its own node's resource
    ]
    before = len(ray.util.list_named_actors()) if hasattr(ray.util, "list_named_actors") else None
    for e, message in cases:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            anyio.run(e.start)
        assert e.health().workers == {"small": "stopped", "large": "stopped"}
    if before is not None:
        assert len(ray.util.list_named_actors()) == before  # no actor was left waiting
    assert ray.is_initialized()  # the cluster this process connected to is still there


def test_importing_tokenrouter_does_not_import_ray():
    code = "import sys, tokenrouter; from tokenrouter import Engine, RayPlacement; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


LOCAL_RAY = textwrap.dedent(
    """
    import json, sys, anyio, torch, ray
    torch.set_num_threads(1)
    from tokenrouter import Engine, ModelSpec, RayPlacement, SamplingParams
    sys.path.insert(0, sys.argv[2])
    from tests.ray_processes import descendants, wait_gone

    async def main():
        spec = ModelSpec(path=sys.argv[1], dtype="float64", kv_cache_tokens=256, placement=RayPlacement())
        async with Engine(models={"m": spec}, num_threads=1, ray_address="local") as e:
            out = await e.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            started = descendants()
        left = wait_gone(started, 60)
        state = {"tokens": out.token_ids, "connected": ray.is_initialized(), "started": len(started), "left": left}
        print(json.dumps(state))

    anyio.run(main)
    """
)


def test_ray_address_local_starts_ray_for_the_engine_and_stops_it_at_close(tiny_model):
    """In a process of its own (this one is connected to the test cluster): the engine starts a
    Ray instance, serves from an actor, and at close stops it, with every process it started."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root, RAY_ADDRESS="")
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY, str(tiny_model), root], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["tokens"]) == 4
    assert not report["connected"] and report["started"] > 0 and report["left"] == {}, report
