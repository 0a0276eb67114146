"""Same tokens at any load: a request's tokens, and the bits of their logprobs, are the same when
it runs alone (one request in flight) and among others of other lengths, under every kind of
policy, with its prompt prefilled in one chunk or several, found in the prefix cache or not, and
sampled with a seed. The promise and where it holds: docs/policies.md ("Same tokens at any load").

The tiny models compute in float32 on oneDNN's packed linears and the C attention kernel, each
row alone; the demo pair's version (the GGUF block kernels and the layer stack) is in
tests/test_real_demo_pair.py.
"""

from __future__ import annotations

import random

import anyio
import pytest

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import moved_under_load, token_signature, wait_all_free
from tokenrouter import ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.policies import BiLD, RStitch, Single, Speculative

POLICIES = {
    "single": lambda: Single("large"),
    "rstitch": lambda: RStitch(tau=TINY_PAIR_TAU),
    "bild": lambda: BiLD(),
    "speculative": lambda: Speculative(k="auto"),  # drafts alone; under load it may decode the target alone
    "speculative-4": lambda: Speculative(k=4),  # drafts at every load
}


@pytest.fixture(scope="module")
def pair(tiny_pair, tmp_path_factory):
    """The tiny pair's large model and, as small, a perturbed copy of it: they agree on most
    tokens, so drafts are accepted and rejected and RStitch hands off both ways."""
    from tokenrouter.testing import build_perturbed_copy

    root = tmp_path_factory.mktemp("same-tokens")
    return {"small": build_perturbed_copy(tiny_pair["large"], root / "small", noise=0.02), "large": tiny_pair["large"]}


def _specs(pair: dict, **kw) -> dict:
    return {n: ModelSpec(path=p, dtype="float32", kv_cache_tokens=8192, block_size=8, **kw) for n, p in pair.items()}


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def alone_then_among_others(specs, make_policy, mine, others, params_of, threads: int = 1, hook=None):
    """Each of `mine` alone, one after another; then all of `mine` and `others` at once. Returns
    the two lists of `mine`'s signatures. `hook(engine)` runs first, if given."""

    async def main():
        async with Engine(models=specs, policy=make_policy(), num_threads=threads) as engine:
            if hook is not None:
                hook(engine)
            alone = [token_signature(await engine.generate(p, params_of(i))) for i, p in enumerate(mine)]
            loaded: list = [None] * len(mine)

            async def one(i: int, prompt: list[int]) -> None:
                out = await engine.generate(prompt, params_of(i))
                if i < len(mine):
                    loaded[i] = token_signature(out)

            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(mine + others):
                    tg.start_soon(one, i, prompt)
            await wait_all_free(engine)
            return alone, loaded

    return anyio.run(main)


@pytest.mark.cpu_levels
@pytest.mark.parametrize("policy", POLICIES)
def test_a_greedy_request_writes_the_same_tokens_alone_and_among_others(pair, tokenizer, policy, cpu_level):
    vocab = len(tokenizer)
    mine = _prompts(vocab, [3 + 4 * i for i in range(12)], seed=1)
    others = _prompts(vocab, [2 + 7 * i for i in range(12)], seed=2)

    def params(i: int) -> SamplingParams:  # the others write other lengths
        return SamplingParams(temperature=0.0, max_tokens=24 + 5 * (i % 4) * (i >= 12), ignore_eos=True, logprobs=1)

    alone, loaded = alone_then_among_others(_specs(pair), POLICIES[policy], mine, others, params)
    assert all(len(tokens) == 24 for tokens, _ in alone)
    moved = moved_under_load(alone, loaded)
    assert not moved, f"requests whose tokens or logprobs moved under load: {moved}"


def test_the_comparison_sees_a_logit_that_moves_with_the_steps_rows(pair, tokenizer):
    """The check above fails where a row's logits depend on its step: here one logit of the large
    model moves by a thousandth in steps of more than one row."""
    from tokenrouter.testing.faults import wrap_forward

    def rows_leak(forward, batch):
        out = forward(batch)
        out.logits[:, 1] += 1e-3 * (len(batch) - 1)
        return out

    vocab = len(tokenizer)
    mine, others = _prompts(vocab, [5, 9, 13], seed=1), _prompts(vocab, [4, 6, 8], seed=2)

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)

    hook = lambda engine: wrap_forward(engine, "large", rows_leak)  # noqa: E731
    alone, loaded = alone_then_among_others(_specs(pair), POLICIES["single"], mine, others, params, hook=hook)
    assert moved_under_load(alone, loaded)


def test_prompts_in_chunks_or_from_the_prefix_cache_give_the_same_tokens(pair, tokenizer):
    """A step budget of 16 tokens splits each prompt into chunks, differently alone and under load
    (where others share the budget); under load `mine` are found in the prefix cache (the alone
    runs put them there) and the others share their first halves. An engine without prefix
    caching and with the whole prompt in one step gives the same tokens too."""
    vocab = len(tokenizer)
    mine = _prompts(vocab, [20 + 9 * i for i in range(8)], seed=3)
    others = [p[: len(p) // 2] + q for p, q in zip(mine, _prompts(vocab, [5 + 3 * i for i in range(8)], seed=4))]

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)

    make = POLICIES["rstitch"]
    alone, loaded = alone_then_among_others(_specs(pair, max_num_batched_tokens=16), make, mine, others, params)
    assert not moved_under_load(alone, loaded), moved_under_load(alone, loaded)
    whole, _ = alone_then_among_others(_specs(pair, enable_prefix_caching=False), make, mine, [], params)
    assert moved_under_load(alone, whole) == []


@pytest.mark.parametrize("policy", ["rstitch", "bild"])
def test_seeded_sampling_gives_the_same_tokens_alone_and_among_others(pair, tokenizer, policy):
    """A seeded draw is a hash of (seed, position), and under these policies a request's path
    (which model writes each token) follows its own logits alone. Not under Speculative: the
    target checks a whole step's drafts once any row's are due, so how many drafts a request has
    at a check follows the others in flight; for greedy rows that changes nothing, for sampled
    ones the acceptance test then draws other numbers (the target's distribution, another token;
    docs/policies.md)."""
    vocab = len(tokenizer)
    mine = _prompts(vocab, [4 + 5 * i for i in range(8)], seed=5)
    others = _prompts(vocab, [3 + 6 * i for i in range(8)], seed=6)

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, ignore_eos=True, seed=100 + i, logprobs=1)

    alone, loaded = alone_then_among_others(_specs(pair), POLICIES[policy], mine, others, params)
    assert not moved_under_load(alone, loaded), moved_under_load(alone, loaded)
    assert len({tuple(tokens) for tokens, _ in alone}) > 1  # sampled: not one fixed answer


def test_deterministic_serves_the_invariant_kernels_and_refuses_the_others(pair, tokenizer):
    """Engine(deterministic=True): every model on the C attention kernel and oneDNN's packed
    linears, the same tokens alone and under load; a setting that needs a kernel whose rows depend
    on the step is refused, naming the model and the setting."""
    vocab = len(tokenizer)
    mine, others = _prompts(vocab, [6, 11, 17], seed=7), _prompts(vocab, [4, 9, 23], seed=8)

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)

    seen = {}

    def kernels(engine) -> None:
        models = engine.info().models
        seen.update({m: (models[m].linear_kernel, s.attention_backend) for m, s in engine.stats().items()})

    specs = {n: ModelSpec(path=p, kv_cache_tokens=4096, block_size=8, deterministic=True) for n, p in pair.items()}
    alone, loaded = alone_then_among_others(specs, POLICIES["rstitch"], mine, others, params, hook=kernels)
    assert not moved_under_load(alone, loaded)
    assert seen == {"small": ("onednn", "cpu"), "large": ("onednn", "cpu")}, seen
    refused = {
        "attention_backend": "torch",
        "onednn_linear": False,
        "dtype": "float64",
        "quantization": "gguf+bf16",
        "device": "cuda",
    }
    for field, value in refused.items():
        with pytest.raises(ConfigError, match=rf"models\['large'\]: deterministic=True with {field}="):
            Engine(models={"large": ModelSpec(path=pair["large"], **{field: value})}, deterministic=True)
