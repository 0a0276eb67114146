"""tests/test_cancellation.py's matrix with each model's worker in a Ray actor on its own node.

Every state of a routed request that applies (waiting, prefilling, decoding, handing off,
pending at the peer, mid-hand-off; under Speculative drafting, in transit to the verifier,
verifying) by abort(), a cancelled task and a stream left early: the gate (`RemoteStepGate`)
freezes the actor's worker in the state, the request is cancelled, the gate opens. Then the
caller saw a clean end, the KV pools of both actors are whole, nothing is left anywhere, the
victim made at most the frozen step's tokens after the gate opened (counted in the actors,
where they are made), and a bystander running alongside got exactly the reference output.

The engine per policy is shared by the cases (each leaves it as it found it, which is checked);
closing the engine with requests in flight (the fourth means) is run in the state that leaves a
hand-off in the frozen worker's inbox, then the engine starts again (new actors) and serves.
Speculative decoding through the actors is lossless: the target's own greedy tokens.
"""

from __future__ import annotations

from functools import partial

import anyio
import pytest
import torch

from tests.helpers import RemoteStepGate, generate_all, hf_greedy, holds_nothing_anywhere, wait_all_free
from tests.test_cancellation import (
    BYSTANDER,
    BYSTANDER_PROMPT,
    CASES,
    POLICIES,
    STATES,
    cancel_victim,
    check_ends,
    parties,
    start_parties,
)
from tokenrouter import Engine, ModelSpec, RayPlacement, SamplingParams
from tokenrouter.testing import handoff_waiting, load_reference_models, reference_generate, workers_of

REMOTE_CASES = [(s, m) for s, m in CASES if m != "engine_exit"]
PLACE = {"small": RayPlacement(resources={"node_small": 1}), "large": RayPlacement(resources={"node_large": 1})}


def _specs(pair):
    base = {"dtype": "float64", "kv_cache_tokens": 1024, "block_size": 8, "max_num_batched_tokens": 16}
    return {name: ModelSpec(path=path, placement=PLACE[name], **base) for name, path in pair.items()}


@pytest.fixture(scope="module")
def bystander_ref(tiny_pair):
    models = load_reference_models(tiny_pair, torch.float64)
    return {name: reference_generate(p, models, BYSTANDER_PROMPT, BYSTANDER) for name, p in POLICIES.items()}


@pytest.fixture(scope="module")
def engines(ray_cluster, tiny_pair):
    """One engine per policy, started when a case first needs it, closed when the module ends."""
    made: dict[str, Engine] = {}

    def get(policy: str) -> Engine:
        if policy not in made:
            made[policy] = Engine(models=_specs(tiny_pair), policy=POLICIES[policy], num_threads=1)
            anyio.run(made[policy].start)
        return made[policy]

    yield get
    for engine in made.values():
        anyio.run(engine.close)


async def _cancel(engine, state, means, result):
    """Freeze the gated worker in `state`, cancel the victim by `means` (engine_exit: close the
    engine while frozen), open the gate. Returns the gate."""
    gated, predicate, victim_after_gate, _ = STATES[state]
    gate = RemoteStepGate(workers_of(engine)[gated], predicate, counted=list(workers_of(engine).values()))
    leave = anyio.Event()
    bystander, victim = parties(engine, means, result, leave)
    scope_box: list = []
    try:
        async with anyio.create_task_group() as tg:
            large = workers_of(engine)["large"]  # the victim's hand-off waits in its inbox, in its actor
            handed_off = partial(large.inspect, partial(handoff_waiting, request_id="victim"))
            await start_parties(tg, gate, bystander, victim, scope_box, victim_after_gate, handed_off)
            await cancel_victim(engine, means, scope_box, leave)
            if means == "engine_exit":
                late = {}
                async with anyio.create_task_group() as closing:
                    closing.start_soon(engine.close)
                    await anyio.sleep(0.05)
                    late["tokens"] = gate.late_tokens()  # before the actors go
                    gate.open()
                return late
            await anyio.sleep(0.05)  # let the cancellation reach the actors while frozen
            gate.open()
    finally:
        if not gate.opened and workers_of(engine):
            gate.open()  # a failing case must not leave the worker frozen for the next one
    late = gate.late_tokens()
    gate.remove()
    return {"tokens": late}


@pytest.mark.parametrize("state, means", REMOTE_CASES, ids=[f"{s}-{m}" for s, m in REMOTE_CASES])
def test_cancel_in_every_state_with_workers_in_actors(engines, bystander_ref, state, means):
    policy = STATES[state][3]
    engine = engines(policy)
    result: dict = {}

    async def main():
        with anyio.fail_after(90):  # a broken promise fails the test instead of hanging it
            late = await _cancel(engine, state, means, result)
            await wait_all_free(engine)  # KV free in both actors, nothing running, waiting or pending
            return late

    late = anyio.run(main)
    assert holds_nothing_anywhere(engine)
    check_ends(result, means, late["tokens"], policy, bystander_ref[policy])
    assert engine.health().healthy


def test_closing_with_a_hand_off_in_a_frozen_actors_inbox_ends_everything_and_starts_again(engines, bystander_ref):
    engine = engines("everyk")
    old = list(workers_of(engine).values())
    result: dict = {}

    async def main():
        # a hang guard, not a timing: it holds a close, two new actors' loads and a request, and on
        # 2 cores busy with other work (an evaluation beside the suite) 120 s ran out in the loads
        with anyio.fail_after(300):
            await _cancel(engine, "mid_handoff", "engine_exit", result)
            assert result["victim"].finish_reason == "abort"
            by = result["bystander"]  # an engine exit ends everyone still running
            assert by.finish_reason == "abort" or by.token_ids == bystander_ref["everyk"].token_ids
            for w in old:  # each actor's last statistics, sent as it stopped: its KV pool was whole
                s = w.stats()
                assert (
                    not s.alive and s.running == s.pending == s.waiting == 0 and s.kv_blocks_free == s.kv_blocks_total
                )
            assert engine.health().workers == {"small": "stopped", "large": "stopped"}
            await engine.start()  # new actors
            out = await engine.generate(BYSTANDER_PROMPT, BYSTANDER)
            assert out.token_ids == bystander_ref["everyk"].token_ids
            await wait_all_free(engine)

    anyio.run(main)
    assert holds_nothing_anywhere(engine) and engine.health().healthy


def test_speculative_decoding_through_actors_is_lossless(engines, tiny_pair):
    engine = engines("speculative")
    prompts = [[(5 * i + 3 * j) % 300 + 3 for j in range(4 + i)] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = anyio.run(generate_all, engine, prompts, params)
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(tiny_pair["large"], p, 12)  # the target's own tokens
    assert {m for out in outs for m in out.token_models} == {"small", "large"}  # drafts were accepted
    anyio.run(wait_all_free, engine)
