"""Cancellation in every state of a routed request, by every means a caller has.

States: waiting (admitted, not yet scheduled), prefilling (between chunks), decoding, handing
off (cancelled during the step that sends it to the peer, so the hand-off arrives after the
abort), pending at a peer (its KV kept on the model it left), and in the middle of a hand-off
(the message posted to the peer's inbox, not yet taken); and under a verifying policy
(Speculative): drafting (tentative tokens on the draft model), in transit to the verifier, and
verifying (the target about to check the drafts). Means: `abort()`, cancelling the caller's task, leaving a
stream early, and closing the engine. A `StepGate` freezes the worker in the state, the request
is cancelled, the gate opens. Then: the caller saw a clean end, every worker's KV is free, the
engine tracks nothing, and a bystander request running alongside got exactly the reference
output (closing the engine ends the bystander too, and the engine starts again).
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import anyio
import pytest
import torch

from tests.helpers import EveryK, StepGate, holds_nothing, wait_all_free, wait_until
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.engine import SeqStatus
from tokenrouter.policies import Speculative
from tokenrouter.testing import (
    handoff_waiting,
    kv_blocks_in_use,
    live_sequences,
    load_reference_models,
    reference_generate,
    workers_of,
)

K = 4  # the policy moves the request to the other model after every K tokens
POLICY = EveryK(K)
POLICIES = {"everyk": POLICY, "speculative": Speculative(k=3)}
VICTIM_PROMPT = [(7 * i) % 300 + 3 for i in range(100)]  # long: prefilled in chunks of 16
BYSTANDER_PROMPT = [11, 12, 13, 14, 15]
BYSTANDER = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
VICTIM = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)


def _seq(worker, rid="victim"):
    return live_sequences(worker).get(rid)


def _waiting(w):
    s = _seq(w)
    return s is not None and s.status is SeqStatus.WAITING and s.num_computed == 0


def _prefilling(w):
    s = _seq(w)
    return s is not None and s.status is SeqStatus.RUNNING and 0 < s.num_computed < len(VICTIM_PROMPT)


def _decoding(w):
    s = _seq(w)
    return s is not None and s.status is SeqStatus.RUNNING and 2 <= s.num_generated < K


def _handing_off(w):  # this step writes the K-th token and hands the request to the large model
    s = _seq(w)
    return s is not None and s.status is SeqStatus.RUNNING and s.num_generated == K - 1


def _pending_at_peer(w):  # gated on the large model: the victim runs there, its KV kept on the small one
    s = _seq(w)
    return s is not None and s.status is SeqStatus.RUNNING and s.num_generated > K


def _bystander_on_large(w):
    s = _seq(w, "bystander")
    return s is not None and s.status is SeqStatus.RUNNING


def _drafting(w):  # tentative tokens on the draft model, after some were confirmed (and streamed)
    s = _seq(w)
    return (
        s is not None
        and s.status is SeqStatus.RUNNING
        and s.num_confirmed > len(VICTIM_PROMPT)
        and len(s.token_ids) > s.num_confirmed
    )


def _verifying(w):  # the target's next step checks the victim's drafts
    s = _seq(w)
    return s is not None and s.status is SeqStatus.RUNNING and s.verify_start is not None


# state -> (the worker to gate, predicate, the victim starts only once the gate is hit, policy)
STATES = {
    "waiting": ("small", _waiting, False, "everyk"),
    "prefilling": ("small", _prefilling, False, "everyk"),
    "decoding": ("small", _decoding, False, "everyk"),
    "handing_off": ("small", _handing_off, False, "everyk"),  # the hand-off is sent after the cancellation
    "pending_at_peer": ("large", _pending_at_peer, False, "everyk"),
    "mid_handoff": ("large", _bystander_on_large, True, "everyk"),
    "drafting": ("small", _drafting, False, "speculative"),
    "to_verifier": ("large", _bystander_on_large, True, "speculative"),  # the drafts wait in its inbox
    "verifying": ("large", _verifying, False, "speculative"),
}
MEANS = ["abort", "cancel_task", "leave_stream", "engine_exit"]
CASES = [
    (state, means)
    for state in STATES
    for means in MEANS
    # Leaving a stream happens between deltas: a request with no token yet has none to leave at.
    if not (means == "leave_stream" and state in ("waiting", "prefilling", "to_verifier"))
]


def _count_late_tokens(engine, gate):
    """Tokens each request produced after the gate opened (at most the frozen step's one token,
    if it was cancelled while frozen)."""
    late: Counter = Counter()
    for worker in workers_of(engine).values():
        sink = worker.sink

        def counting(events, sink=sink):
            if gate.opened.is_set():
                for ev in events:
                    late[ev.request_id] += len(ev.token_ids)
            sink(events)

        worker.sink = counting
    return late


def parties(engine, means, result, leave):
    """The bystander's and the victim's tasks of a case; what each saw goes in `result`. A
    victim leaving its stream waits for `leave` after its first token."""

    async def bystander():
        result["bystander"] = await engine.generate(BYSTANDER_PROMPT, BYSTANDER, request_id="bystander")

    async def victim(scope_box):
        with anyio.CancelScope() as scope:
            scope_box.append(scope)
            if means == "leave_stream":
                async for delta in engine.stream(VICTIM_PROMPT, VICTIM, request_id="victim"):
                    if delta.token_ids:
                        await leave.wait()
                        break
                result["victim"] = "left"
            else:
                result["victim"] = await engine.generate(VICTIM_PROMPT, VICTIM, request_id="victim")
        result["victim_cancelled"] = scope.cancelled_caught

    return bystander, victim


async def start_parties(tg, gate, bystander, victim, scope_box, victim_after_gate, victim_handed_off) -> None:
    """Start the bystander and the victim so that the gated worker freezes in the state. With
    `victim_after_gate`, the large model is busy with the bystander while the victim's hand-off
    waits in its inbox (`victim_handed_off()` says when it is there)."""
    tg.start_soon(bystander)
    if victim_after_gate:
        await gate.wait_hit()
        tg.start_soon(victim, scope_box)
        await wait_until(victim_handed_off, 60, "the victim's hand-off in the large model's inbox")
    else:
        tg.start_soon(victim, scope_box)
        await gate.wait_hit()


async def cancel_victim(engine, means, scope_box, leave) -> None:
    """Cancel the victim by `means` (engine_exit is the caller's: it closes the engine)."""
    if means == "abort":
        await engine.abort("victim")
    elif means == "cancel_task":
        while not scope_box:
            await anyio.sleep(0.001)
        scope_box[0].cancel()
    elif means == "leave_stream":
        leave.set()


def check_ends(result, means, late_tokens, policy, bystander_ref) -> None:
    """The victim saw a clean end by `means` and made at most the frozen step's tokens (one, or a
    check's accepted drafts and the verifier's own); the bystander got the reference."""
    if means == "abort":
        assert result["victim"].finish_reason == "abort"
    elif means == "cancel_task":
        assert result["victim_cancelled"] and "victim" not in result
    else:
        assert result["victim"] == "left"
    frozen_step = (POLICIES[policy].max_draft or 0) + 1
    assert late_tokens["victim"] <= frozen_step, "the victim kept running after it was cancelled"
    by = result["bystander"]
    assert by.token_ids == bystander_ref.token_ids and by.token_models == bystander_ref.token_models


@pytest.fixture(scope="module")
def bystander_ref(tiny_pair):
    models = load_reference_models(tiny_pair, torch.float64)
    return {name: reference_generate(p, models, BYSTANDER_PROMPT, BYSTANDER) for name, p in POLICIES.items()}


def _specs(pair):
    base = {"dtype": "float64", "kv_cache_tokens": 1024, "block_size": 8, "max_num_batched_tokens": 16}
    return {name: ModelSpec(path=path, **base) for name, path in pair.items()}


@pytest.mark.parametrize("state, means", CASES, ids=[f"{s}-{m}" for s, m in CASES])
def test_cancel_in_every_state(tiny_pair, bystander_ref, state, means):
    gated, predicate, victim_after_gate, policy = STATES[state]
    bystander_ref = bystander_ref[policy]

    async def main():
        engine = Engine(models=_specs(tiny_pair), policy=POLICIES[policy], num_threads=1)
        await engine.start()
        old_workers = list(workers_of(engine).values())
        gate = StepGate(workers_of(engine)[gated], predicate)
        late_tokens = _count_late_tokens(engine, gate)
        result: dict = {}
        leave = anyio.Event()
        bystander, victim = parties(engine, means, result, leave)
        scope_box: list = []
        async with anyio.create_task_group() as tg:
            handed_off = partial(handoff_waiting, workers_of(engine)["large"], "victim")
            await start_parties(tg, gate, bystander, victim, scope_box, victim_after_gate, handed_off)
            await cancel_victim(engine, means, scope_box, leave)
            if means == "engine_exit":
                async with anyio.create_task_group() as closing:
                    closing.start_soon(engine.close)
                    await anyio.sleep(0.05)
                    gate.open()
            else:
                await anyio.sleep(0.02)  # let the cancellation reach the workers while frozen
                gate.open()

        if means == "engine_exit":
            assert result["victim"].finish_reason == "abort"
            by = result["bystander"]  # an engine exit ends everyone still running
            assert by.finish_reason == "abort" or by.token_ids == bystander_ref.token_ids
            assert all(not w.alive and kv_blocks_in_use(w) == 0 for w in old_workers)
            assert engine.health().workers == {"small": "stopped", "large": "stopped"}
            await engine.start()  # and it starts again
            out = await engine.generate(BYSTANDER_PROMPT, BYSTANDER)
            assert out.token_ids == bystander_ref.token_ids
            await wait_all_free(engine)
            assert holds_nothing(engine)
            await engine.close()
            return

        await wait_all_free(engine)  # KV free in every worker, nothing running, waiting or pending
        assert holds_nothing(engine)
        check_ends(result, means, late_tokens, policy, bystander_ref)
        assert engine.health().healthy
        await engine.close()

    async def bounded():
        with anyio.fail_after(60):  # a broken promise fails the test instead of hanging it
            await main()

    anyio.run(bounded)
