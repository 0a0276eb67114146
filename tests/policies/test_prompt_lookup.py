"""Prompt-lookup drafts in Speculative (policies/lookup.py): where a request's latest tokens occurred
before, the target checks the tokens that followed them, with no draft-model step; elsewhere the
draft model drafts. Lossless: greedy, the target's own tokens; seeded sampling, the target alone's
very draws (a lookup draft is a point mass, accepted where the target's own draw is the draft)."""

from __future__ import annotations

import random
import shutil

import anyio
import numpy as np
import pytest
import torch

from tests.helpers import generate_all, hf_greedy, hf_greedy_penalized, holds_nothing, penalized_logits, wait_all_free
from tokenrouter import ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.policies import PromptLookup, Single, Speculative
from tokenrouter.policies.lookup import TokenHistory, find_continuation


def _specs(pair, **kw):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=4096, block_size=8, **kw) for n, p in pair.items()}


def _serve(specs, policy, prompts, params) -> tuple[list, dict]:
    """The outputs and each worker's stats; every block free afterwards, checked."""

    async def main():
        async with Engine(models=specs, policy=policy) as e:
            outs = await generate_all(e, prompts, params)
            await wait_all_free(e)
            assert holds_nothing(e)
            return outs, e.stats()

    return anyio.run(main)


def _bigram_copy(source, dest):
    """A copy of `source` whose attention adds nothing (output projections zeroed): its next token
    depends on the last token alone, so a passage it has seen goes on as it went before, the
    way a real model copies a quoted file. Its greedy chains end in cycles, which it repeats."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, dest)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    model.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def copying_pair(tiny_pair, tmp_path_factory):
    """A copying target (`_bigram_copy` of the tiny pair's large model) and, as drafter, a
    perturbed copy of it that agrees with it often, not always."""
    from tokenrouter.testing import build_perturbed_copy

    root = tmp_path_factory.mktemp("copying")
    large = _bigram_copy(tiny_pair["large"], root / "large")
    return {"small": build_perturbed_copy(large, root / "small", noise=0.01), "large": large}


def _chain(large, length: int) -> list[int]:
    """`length` distinct tokens, each the copying target's greedy successor of the one before."""
    from tests.helpers import hf_model

    model = hf_model(large)
    with torch.no_grad():
        vocab = model.config.vocab_size
        nxt = model(torch.arange(vocab)[:, None]).logits[:, 0].argmax(-1).tolist()
    for start in range(3, vocab):
        chain = [start]
        while len(chain) < length and nxt[chain[-1]] not in chain:
            chain.append(nxt[chain[-1]])
        if len(chain) == length:
            return chain
    raise AssertionError("no chain that long")


def _quoting_prompts(large, tokenizer, n: int, seed: int) -> list[list[int]]:
    """Prompts that quote a passage and then start it again: random tokens, the passage, random
    tokens, its first two tokens (the answer goes on with the rest of it)."""
    rng = random.Random(seed)
    passage = _chain(large, 14)
    out = []
    for _ in range(n):
        noise = [rng.randrange(3, len(tokenizer)) for _ in range(rng.randint(2, 9))]
        out.append(noise + passage + noise[::-1] + passage[:2])
    return out


def _random_prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, len(tokenizer)) for _ in range(rng.choice([3, 9, 17]))] for _ in range(n)]


def test_greedy_lookup_writes_the_target_alone_s_tokens(copying_pair, tokenizer):
    """Quoting and random prompts at once, some with a repetition penalty, some asking logprobs:
    every answer is Hugging Face generate's on the target; lookup drafts were checked and most
    accepted; an accepted one is the target's (`token_models`), with the target's logprob."""
    large = copying_pair["large"]
    prompts = _quoting_prompts(large, tokenizer, 6, seed=1) + _random_prompts(tokenizer, 6, seed=2)
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=12 + 3 * i,
            ignore_eos=True,
            logprobs=1 if i % 3 == 0 else None,
            repetition_penalty=1.3 if i % 4 == 1 else 1.0,
        )
        for i in range(len(prompts))
    ]
    outs, stats = _serve(_specs(copying_pair), Speculative(k=3, lookup=True), prompts, params)
    for prompt, sp, out in zip(prompts, params, outs):
        assert out.token_ids == hf_greedy_penalized(large, prompt, sp.max_tokens, sp), prompt
        if sp.logprobs is not None:
            rows = torch.log_softmax(penalized_logits(large, prompt + out.token_ids, len(prompt), sp), -1)
            for i, (record, model) in enumerate(zip(out.logprobs, out.token_models)):
                assert record.model == model
                if model == "large":
                    assert abs(record.logprob - float(rows[i, out.token_ids[i]])) < 1e-9
    looked_up = stats["large"]
    assert looked_up.proposed_accepted > 0 and looked_up.proposed_tokens >= looked_up.proposed_accepted
    assert stats["small"].proposed_tokens == 0  # only the verifier proposes


def test_a_quoted_passage_is_drafted_by_lookup_not_the_draft_model(copying_pair, tokenizer):
    """An answer that goes on with a passage of its prompt: the target writes first (a request
    with lookup starts there), lookup drafts the rest, every one accepted, and the draft model
    never steps: it never takes the prompt in."""
    large = copying_pair["large"]
    (prompt,) = _quoting_prompts(large, tokenizer, 1, seed=3)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs, stats = _serve(_specs(copying_pair), Speculative(k=2, lookup=PromptLookup(tokens=8)), [prompt], params)
    assert outs[0].token_ids == hf_greedy(large, prompt, 10)
    s = stats["large"]
    assert s.proposed_tokens == s.proposed_accepted >= 6
    assert stats["small"].steps == 0


def test_without_a_repeat_the_draft_model_drafts(tiny_pair, tokenizer):
    """No suffix of two tokens occurs twice in prompt and answer: nothing is looked up, the draft
    model drafts every round, and the answer is still the target's."""
    prompt = list(range(40, 52))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs, stats = _serve(_specs(tiny_pair), Speculative(k=3, lookup=True), [prompt], params)
    ids = prompt + outs[0].token_ids
    assert len(set(zip(ids, ids[1:]))) == len(ids) - 1  # no bigram repeats: nothing to find
    assert outs[0].token_ids == hf_greedy(tiny_pair["large"], prompt, 10)
    assert stats["large"].proposed_tokens == 0
    assert stats["small"].steps >= 3 and stats["large"].handoffs_received >= 3


def test_sampled_lookup_equals_the_slow_reference(copying_pair, tokenizer):
    """Seeded sampling: tokens, and who wrote each, equal `reference_generate`, which runs the
    same policy the slow, obvious way (lookup drafts included)."""
    from tokenrouter.testing import load_reference_models, reference_generate

    large = copying_pair["large"]
    prompts = _quoting_prompts(large, tokenizer, 4, seed=5) + _random_prompts(tokenizer, 4, seed=6)
    params = [
        SamplingParams(temperature=0.8, max_tokens=14, ignore_eos=True, seed=100 + i) for i in range(len(prompts))
    ]
    outs, stats = _serve(_specs(copying_pair), Speculative(k=3, lookup=True), prompts, params)
    models = load_reference_models(copying_pair, dtype=torch.float64)
    for prompt, sp, out in zip(prompts, params, outs):
        ref = reference_generate(Speculative(k=3, lookup=True), models, prompt, sp)
        assert (out.token_ids, out.token_models) == (ref.token_ids, ref.token_models)
    assert stats["large"].proposed_accepted > 0


def test_seeded_lookup_draws_exactly_the_target_alone_s_tokens(copying_pair, tokenizer):
    """A lookup draft is accepted where the target's own seeded draw is the draft, and a rejected
    one is redrawn with that same seed and position: so, with a draft model that is the target
    itself (whose drafts p = q always accepts, drawn as the target draws), a seeded request
    writes the target alone's tokens exactly, lookup drafts rejected and accepted alike."""
    large = copying_pair["large"]
    same = {"small": large, "large": large}
    prompts = _quoting_prompts(large, tokenizer, 4, seed=7) + _random_prompts(tokenizer, 4, seed=8)
    params = [
        SamplingParams(temperature=0.5, max_tokens=20, ignore_eos=True, seed=200 + i) for i in range(len(prompts))
    ]
    alone, _ = _serve(_specs({"large": large}), Single("large"), prompts, params)
    outs, stats = _serve(_specs(same), Speculative(k=3, lookup=True), prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    s = stats["large"]
    assert 0 < s.proposed_accepted < s.proposed_tokens  # some lookup drafts rejected, some accepted


def test_lookup_options_are_checked(tiny_pair):
    with pytest.raises(ConfigError, match=r"lookup must be True, False or a PromptLookup"):
        Speculative(lookup="yes")
    with pytest.raises(ConfigError, match=r"min_n must be an int in \[1, 16\], got 0"):
        PromptLookup(min_n=0)
    with pytest.raises(ConfigError, match=r"max_n must be an int in \[1, 16\], got 17"):
        PromptLookup(max_n=17)
    with pytest.raises(ConfigError, match=r"min_n must be <= max_n"):
        PromptLookup(min_n=3, max_n=2)
    with pytest.raises(ConfigError, match=r"tokens must be an int in \[1, 64\] or None, got 65"):
        PromptLookup(tokens=65)
    spec = Speculative(k=2, lookup=PromptLookup(tokens=12))
    assert spec.max_draft == 12  # a check holds a whole proposal
    with pytest.raises(ConfigError, match="max_draft=12 needs 13 tokens"):
        Engine(models=_specs(tiny_pair, max_num_batched_tokens=8), policy=spec)


class _ProposesTooMuch(Speculative):
    """Proposes more tokens than a check may hold, after every token of the target's."""

    def route(self, result):
        route = super().route(result)
        if result.model == self.target:
            route.next_model[:] = 1
            route.proposals = [[5] * (self.max_draft + 1) for _ in range(len(result))]
        return route


def test_a_bad_proposal_fails_its_requests_and_frees_them(tiny_pair):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs, _ = _serve(_specs(tiny_pair), _ProposesTooMuch(k=2, lookup=True), [[5, 6, 7], [9, 10]], params)
    for out in outs:
        assert out.finish_reason == "error" and "route proposed 3 tokens; at most max_draft=2" in out.error


def test_the_longest_latest_match_is_found():
    ids = np.array([1, 2, 3, 4, 9, 2, 3, 5, 7, 1, 2, 3])
    assert find_continuation(ids, 1, 4, 3).tolist() == [4, 9, 2]  # "1 2 3" beats the later "2 3"
    assert find_continuation(ids, 2, 2, 3).tolist() == [5, 7, 1]  # "2 3": the latest occurrence
    assert find_continuation(ids, 4, 4, 3).tolist() == []  # "9 1 2 3"... never occurred
    assert find_continuation(np.array([8, 5, 5, 5]), 2, 4, 3).tolist() == [5]  # runs to the end
    assert find_continuation(np.array([4, 4]), 2, 4, 3).tolist() == []  # too short for min_n


def test_the_history_array_follows_the_list():
    history = TokenHistory()
    tokens = list(range(300))
    assert history.sync(tokens[:10], 99).tolist() == tokens[:10] + [99]
    assert history.sync(tokens, 7).tolist() == tokens + [7]  # grown past its first capacity
    assert history.sync(tokens[:5] + [1, 1], 2).tolist() == tokens[:5] + [1, 1, 2]  # another list: again
