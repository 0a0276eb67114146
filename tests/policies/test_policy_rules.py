"""Each policy's rule on its own, with hand-set values (design.md's exact rules).

The engine-versus-reference tests run the same policy code on both sides, so a rule written the
wrong way round would pass them: these pin the rules themselves, each comparison at its boundary.
scripts/check_promises.py breaks each rule once and expects these tests to fail.
"""

from __future__ import annotations

import math

import anyio
import pytest
import torch
from transformers import AutoModelForCausalLM

from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import (
    CITER,
    HIDDEN,
    R2R,
    CoLLM,
    Escalation,
    Policy,
    Route,
    RStitch,
    StepResult,
    normalized_entropy,
)
from tokenrouter.policies.routers import ModelIdentity, RouterConfig, RouterNet, router_features


def step(model: str, index: int, entropy=None, n: int | None = None, **kw) -> StepResult:
    n = n if n is not None else len(entropy)
    return StepResult(
        model=model,
        model_index=index,
        request_ids=[f"r{i}" for i in range(n)],
        tokens=torch.zeros(n, dtype=torch.long),
        logits=torch.zeros(n, 8),
        num_generated=torch.zeros(n, dtype=torch.long),
        states=[{} for _ in range(n)],
        entropy=None if entropy is None else torch.tensor(entropy, dtype=torch.float64),
        **kw,
    )


def decision(route: Route) -> tuple[list[bool], list[int]]:
    return route.keep.tolist(), route.next_model.tolist()


# ---- normalized entropy -------------------------------------------------------------------------------
def test_normalized_entropy_by_hand():
    v = 4
    uniform = torch.zeros(1, v)
    certain = torch.tensor([[0.0, -1e4, -1e4, -1e4]])
    # p = (1/2, 1/4, 1/8, 1/8): H = 1.75 bits = 1.75 ln 2 nats, over ln 4 = 2 ln 2: 0.875
    halving = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    # two equally likely tokens out of 8: ln 2 / ln 8 = 1/3
    two_of_eight = torch.tensor([[5.0, 5.0, -1e4, -1e4, -1e4, -1e4, -1e4, -1e4]])
    assert normalized_entropy(uniform).item() == pytest.approx(1.0)
    assert normalized_entropy(certain).item() == pytest.approx(0.0, abs=1e-9)
    assert normalized_entropy(halving).item() == pytest.approx(0.875)
    assert normalized_entropy(two_of_eight).item() == pytest.approx(1 / 3)
    assert normalized_entropy(torch.cat([uniform, halving])).tolist() == pytest.approx([1.0, 0.875])  # per row
    assert normalized_entropy(halving + 123.0).item() == pytest.approx(0.875)  # logits, not probabilities


# ---- RStitch ----------------------------------------------------------------------------------------
def test_rstitch_small_model_discards_above_tau_and_hands_over():
    p = RStitch(tau=0.03)
    # H <= tau keeps the token (the boundary is confident), H > tau discards it for the large model
    assert decision(p.route(step("small", 0, [0.01, 0.03, 0.0300001, 0.9]))) == (
        [True, True, False, False],
        [0, 0, 1, 1],
    )


def test_rstitch_large_model_keeps_every_token_and_returns_when_confident():
    p = RStitch(tau=0.03)
    assert decision(p.route(step("large", 1, [0.01, 0.03, 0.5]))) == ([True, True, True], [0, 0, 1])


def test_rstitch_names_its_models():
    p = RStitch(tau=0.2, small="a", large="b")
    assert p.models == ["a", "b"]
    assert decision(p.route(step("a", 0, [0.1, 0.3]))) == ([True, False], [0, 1])
    assert decision(p.route(step("b", 1, [0.1, 0.3]))) == ([True, True], [0, 1])


# ---- Escalation -------------------------------------------------------------------------------------
def test_escalation_by_hand():
    p = Escalation(models=["s", "m", "l"], taus=[0.125, 0.25])  # binary fractions: the boundary is exact
    # on the smallest: H > tau discards and escalates to the next model; H = tau keeps, back to 0
    assert decision(p.route(step("s", 0, [0.0625, 0.125, 0.1875]))) == ([True, True, False], [0, 0, 1])
    # on the middle one: its own tau; an accepted token returns control to the smallest
    assert decision(p.route(step("m", 1, [0.1875, 0.25, 0.375]))) == ([True, True, False], [0, 0, 2])
    # the largest always accepts, and control returns to the smallest
    assert decision(p.route(step("l", 2, [0.0, 0.99, 1.0]))) == ([True, True, True], [0, 0, 0])


# ---- the deferral comparisons ------------------------------------------------------------------------
def _router(kind: str) -> RouterNet:
    ident = ModelIdentity(hidden_size=4, vocab_size=8, fingerprint="0" * 16)
    return RouterNet(RouterConfig(kind=kind, hidden_size=4, top_k=3, width=4, threshold=0.5, small=ident, large=ident))


@pytest.mark.parametrize(
    "cls, deferred",
    [
        (R2R, [False, True, True]),  # p >= threshold: deferred, the boundary included
        (CoLLM, [False, False, True]),  # p > threshold
        (CITER, [True, False, False]),  # confidence < threshold
    ],
)
def test_deferral_comparisons_at_the_threshold(cls, deferred):
    p = torch.tensor([0.25, 0.5, 0.75])
    assert cls.defer(p, 0.5).tolist() == deferred

    class Fixed(cls):  # the router's output set by hand; the rest of the policy as it is
        def probability(self, result):
            return p

    policy = Fixed(_router(cls.kind), threshold=0.5)
    keep, nxt = decision(policy.route(step("small", 0, n=3)))
    assert keep == [not d for d in deferred] and nxt == [int(d) for d in deferred]
    # the large model writes one token, kept, and control returns to the small model
    assert decision(policy.route(step("large", 1, n=3))) == ([True] * 3, [0] * 3)


# ---- router features ---------------------------------------------------------------------------------
def test_router_features_by_hand():
    hidden = torch.tensor([[1.0, 2.0]])
    emb = torch.tensor([[3.0, 4.0]])
    logits = torch.log(torch.tensor([[1.0, 2.0, 4.0]]))  # softmax = 1/7, 2/7, 4/7
    r2r = router_features("r2r", hidden, emb, logits, top_k=2)
    # hidden state, the sampled token's embedding, then the top-k log-probabilities, most likely first
    expected = torch.tensor([[1.0, 2.0, 3.0, 4.0, math.log(4 / 7), math.log(2 / 7)]])
    torch.testing.assert_close(r2r, expected)
    for kind in ("citer", "collm"):  # the hidden state alone
        torch.testing.assert_close(router_features(kind, hidden, None, None, top_k=2), hidden)
    assert router_features("r2r", hidden.double(), emb.double(), logits.double(), 2).dtype == torch.float32


# ---- what a policy sees -------------------------------------------------------------------------------
class RecordHidden(Policy):
    """Stays on the one model, recording the hidden state of every sampled token."""

    requires = frozenset({HIDDEN})

    def __init__(self):
        self.seen: list[tuple[int, torch.Tensor]] = []

    @property
    def models(self):
        return ["a", "b"]

    def route(self, result: StepResult) -> Route:
        for n, h in zip(result.num_generated.tolist(), result.hidden):
            self.seen.append((n, h.clone()))
        return Route.stay(result)


def test_hidden_state_is_transformers_last_hidden_state(tiny_pair):
    """`StepResult.hidden` is what transformers reports as `hidden_states[-1]` at the position that
    predicts the sampled token (after the final norm: the output head's input)."""
    policy = RecordHidden()
    prompt = [9, 10, 11, 12, 13]
    specs = {m: ModelSpec(path=tiny_pair["small"], dtype="float64", kv_cache_tokens=256, block_size=8) for m in "ab"}

    async def main():
        async with Engine(models=specs, policy=policy) as e:
            return await e.generate(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))

    out = anyio.run(main)
    assert len(policy.seen) == 6
    # sdpa: transformers' eager attention takes its softmax in float32, a 1e-7 difference in float64
    hf = AutoModelForCausalLM.from_pretrained(tiny_pair["small"], dtype=torch.float64, attn_implementation="sdpa")
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states[-1][0]
    for n, h in policy.seen:
        torch.testing.assert_close(h, states[len(prompt) + n - 1], rtol=1e-9, atol=1e-9)
