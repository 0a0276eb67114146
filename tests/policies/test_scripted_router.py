"""ScriptedRouter: the chain's arithmetic, its rules by hand, determinism through the engine, and
the done-when of issue 53: on a tiny random pair it routes in the demo pair's measured regime.

Every run here is deterministic (fixed prompts, fixed seed, greedy; the script reads no logits),
so the statistical test cannot flake: its sample (64 requests x 64 tokens) is big enough that a
router 5 points off would be far outside it (the share's standard error is under 1 point)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from tests.helpers import wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import PeerMessage, ScriptedRouter, StepResult
from tokenrouter.policies.scripted import (
    DEMO_HANDOFF_RATE,
    DEMO_LARGE_SHARE,
    prompt_key,
    transition_probabilities,
    uniforms,
)
from tokenrouter.testing import load_reference_models, reference_generate

CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks/results/scripted-router/calibration.json"


# ---- the chain -------------------------------------------------------------------------------
@pytest.mark.parametrize("share, rate", [(0.75, 0.3), (0.7, 0.44), (0.2, 0.05), (0.5, 1.0), (0.9, 0.2)])
def test_transition_probabilities_give_the_share_and_the_rate(share, rate):
    a, b = transition_probabilities(share, rate)
    assert 0 < a <= 1 and 0 < b <= 1
    assert a / (a + b) == pytest.approx(share)  # stationary share of "large"
    assert (1 - share) * a + share * b == pytest.approx(rate)  # stationary switches per token


def test_transition_probabilities_by_hand():
    assert transition_probabilities(0.75, 0.3) == pytest.approx((0.6, 0.2))


@pytest.mark.parametrize(
    "share, rate, match",
    [
        (0.0, 0.1, r"large_share must be in \(0, 1\)"),
        (1.0, 0.1, r"large_share must be in \(0, 1\)"),
        (-0.1, 0.1, "large_share"),
        (math.nan, 0.1, "large_share must be a finite number"),
        ("0.5", 0.1, "large_share must be a finite number"),
        (True, 0.1, "large_share must be a finite number"),
        (0.7, 0.0, r"handoff_rate must be in \(0, 2 \* min\(large_share, 1 - large_share\)\] = \(0, 0\.6\]"),
        (0.7, 0.61, r"handoff_rate .* = \(0, 0\.6\]"),
        (0.2, 0.41, r"handoff_rate .* = \(0, 0\.4\]"),
        (0.7, math.inf, "handoff_rate must be a finite number"),
    ],
)
def test_infeasible_pairs_raise_naming_the_field_and_the_limit(share, rate, match):
    with pytest.raises(ValueError, match=match):
        ScriptedRouter(share, rate)


def test_other_arguments_are_checked():
    with pytest.raises(ValueError, match="different models"):
        ScriptedRouter(0.5, 0.2, small="m", large="m")
    with pytest.raises(ValueError, match="seed must be an int"):
        ScriptedRouter(0.5, 0.2, seed=1.5)
    assert ScriptedRouter(0.7, 0.6).to_large == pytest.approx(1.0)  # the limit is feasible: no two small in a row


def test_uniforms_are_a_fixed_function_of_key_and_position():
    keys = np.array([1, 1, 2, 2**64 - 1], dtype=np.uint64)
    pos = np.array([0, 1, 0, 5], dtype=np.int64)
    u = uniforms(keys, pos)
    assert u.tolist() == uniforms(keys[::-1].copy(), pos[::-1].copy())[::-1].tolist()  # row order plays no part
    assert ((u >= 0) & (u < 1)).all() and len(set(u.tolist())) == 4
    many = uniforms(np.full(20000, 12345, dtype=np.uint64), np.arange(20000))
    assert abs(many.mean() - 0.5) < 0.01 and abs((many < 0.3).mean() - 0.3) < 0.01
    assert prompt_key(0, [1, 2, 3]) == prompt_key(0, [1, 2, 3]) != prompt_key(1, [1, 2, 3]) != prompt_key(0, [1, 2])


# ---- the rules, by hand --------------------------------------------------------------------
def _step(policy, model, positions, prompt=(5, 6, 7), states=None):
    n = len(positions)
    return StepResult(
        model=model,
        model_index=policy.models.index(model),
        request_ids=[f"r{i}" for i in range(n)],
        tokens=torch.zeros(n, dtype=torch.long),
        logits=torch.zeros(n, 8),
        num_generated=torch.tensor(positions),
        states=states if states is not None else [{} for _ in range(n)],
        history=[list(prompt) + [9] * p for p in positions],
    )


def test_small_model_hands_over_where_the_chain_leaves_small():
    p = ScriptedRouter(0.6, 0.4, seed=7)  # a = 0.5
    positions = list(range(40))
    route = p.route(_step(p, "small", positions))
    u = uniforms(np.full(40, prompt_key(7, [5, 6, 7]), dtype=np.uint64), np.array(positions))
    leave = (u < p.to_large).tolist()
    assert route.keep.tolist() == [not x for x in leave]  # discarded exactly where it leaves
    assert route.next_model.tolist() == [int(x) for x in leave]
    assert 5 < sum(leave) < 35


def test_large_model_keeps_every_token_and_hands_back_where_the_chain_leaves_large():
    p = ScriptedRouter(0.6, 0.4, seed=7)  # b = 1/3
    positions = list(range(40))
    route = p.route(_step(p, "large", positions))
    u_next = uniforms(np.full(40, prompt_key(7, [5, 6, 7]), dtype=np.uint64), np.array(positions) + 1)
    assert route.keep.all()
    assert route.next_model.tolist() == [0 if x < p.to_small else 1 for x in u_next]


def test_small_model_keeps_the_position_the_large_model_handed_back():
    """The large model drew that position already (small): the small model must not draw it again."""
    p = ScriptedRouter(0.6, 0.4, seed=7)
    key = prompt_key(7, [5, 6, 7])
    leaving = [q for q in range(200) if uniforms(np.array([key], dtype=np.uint64), np.array([q]))[0] < p.to_large]
    q = leaving[0]
    large_state = {}
    p.route(_step(p, "large", [q - 1], states=[large_state]))  # the large model has seen the request
    msg = PeerMessage("r0", "large", "small", tokens=[5, 6, 7] + [9] * q, start=0)
    small_state = {}
    p.receive(p.send(msg, large_state), small_state)
    route = p.route(_step(p, "small", [q], states=[small_state]))
    assert route.keep.tolist() == [True] and route.next_model.tolist() == [0]
    # without the hand-back, the same position leaves small
    assert p.route(_step(p, "small", [q])).keep.tolist() == [False]


# ---- through the engine --------------------------------------------------------------------
def _specs(pair):
    base = {"dtype": "float64", "kv_cache_tokens": 8192, "block_size": 8, "max_num_batched_tokens": 256}
    return {name: ModelSpec(path=path, **base) for name, path in pair.items()}


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 30))] for _ in range(n)]


def _generate(policy, pair, prompts, max_tokens, one_at_a_time=False, seed=0):
    outs = [None] * len(prompts)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    async def main():
        async with Engine(models=_specs(pair), policy=policy, num_threads=1) as engine:

            async def one(i):
                await anyio.sleep(rng.uniform(0, 0.02))
                outs[i] = await engine.generate(prompts[i], params)

            if one_at_a_time:
                for i in range(len(prompts)):
                    outs[i] = await engine.generate(prompts[i], params)
            else:
                async with anyio.create_task_group() as tg:
                    for i in rng.sample(range(len(prompts)), len(prompts)):
                        tg.start_soon(one, i)
            await wait_all_free(engine)

    rng = random.Random(seed)
    anyio.run(main)
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs]
    return outs


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair


def test_same_seed_same_tokens_and_writers_at_any_concurrency_and_as_the_reference(pair, tokenizer):
    policy = ScriptedRouter(0.7, 0.4, seed=3)
    prompts = _prompts(10, len(tokenizer), seed=1)
    alone = _generate(policy, pair, prompts, 24, one_at_a_time=True)
    together = _generate(ScriptedRouter(0.7, 0.4, seed=3), pair, prompts, 24, seed=5)
    for a, b in zip(alone, together):
        assert (a.token_ids, a.token_models, a.num_handoffs) == (b.token_ids, b.token_models, b.num_handoffs)
    assert len({"".join(m[0] for m in o.token_models) for o in alone}) == len(prompts)  # each prompt its own script
    refs = load_reference_models(pair, torch.float64)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt, out in zip(prompts[:4], alone):
        ref = reference_generate(policy, refs, prompt, params)
        assert (out.token_ids, out.token_models) == (ref.token_ids, ref.token_models)
        assert out.num_handoffs == ref.num_handoffs
    other_seed = _generate(ScriptedRouter(0.7, 0.4, seed=4), pair, prompts, 24)
    assert [o.token_models for o in other_seed] != [o.token_models for o in alone]


def test_the_script_reads_no_logits(pair, tokenizer):
    """The same prompts on other weights (the pair's models swapped): the same writers."""
    prompts = _prompts(6, len(tokenizer), seed=2)
    swapped = {"small": pair["large"], "large": pair["small"]}
    a = _generate(ScriptedRouter(0.6, 0.5), pair, prompts, 20)
    b = _generate(ScriptedRouter(0.6, 0.5), swapped, prompts, 20)
    assert [o.token_models for o in a] == [o.token_models for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in b]


def test_demo_pair_holds_the_committed_calibration():
    calibration = json.loads(CALIBRATION.read_text())
    measured = calibration["runs"]["rstitch-real"]
    assert "RStitch(tau=0.03" in measured["policy"] and measured["tokens"] >= 16 * 64
    assert (DEMO_LARGE_SHARE, DEMO_HANDOFF_RATE) == (measured["large_share"], measured["handoff_rate"])
    router = ScriptedRouter.demo_pair(seed=5)
    assert (router.large_share, router.handoff_rate, router.seed) == (DEMO_LARGE_SHARE, DEMO_HANDOFF_RATE, 5)


def test_on_a_tiny_random_pair_it_routes_in_the_demo_pairs_measured_regime(pair, tokenizer):
    """Issue 53's done-when: within 5 points of the real pair's large share and hand-off rate,
    counted as the bench counts them (tokens by writer; `num_handoffs`), 64 tokens a request."""
    measured = json.loads(CALIBRATION.read_text())["runs"]["rstitch-real"]
    outs = _generate(ScriptedRouter.demo_pair(), pair, _prompts(64, len(tokenizer), seed=3), 64)
    tokens = sum(len(o.token_ids) for o in outs)
    share = sum(o.token_models.count("large") for o in outs) / tokens
    rate = sum(o.num_handoffs for o in outs) / tokens
    assert tokens == 64 * 64
    assert abs(share - measured["large_share"]) <= 0.05, (share, measured["large_share"])
    assert abs(rate - measured["handoff_rate"]) <= 0.05, (rate, measured["handoff_rate"])
