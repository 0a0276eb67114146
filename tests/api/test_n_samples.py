"""n > 1: parallel samples of one prompt share its KV blocks (computed once), each has its own
seed stream, reproducibly, under one model and routed; a stream interleaves them by index; an
abort ends them all."""

from __future__ import annotations

import anyio
import pytest

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import wait_all_free, wait_until
from tokenrouter import Engine, ModelSpec, RStitch, SamplingParams

BLOCK = 16


def _prompt(n_tokens: int) -> list[int]:
    return [(7 * i + 3) % 300 + 10 for i in range(n_tokens)]


def test_four_samples_use_the_prompts_blocks_once(tiny_model):
    prompt = _prompt(5 * BLOCK + 6)  # 5 full blocks and a partial one
    full = 5 * BLOCK

    async def main():
        async with Engine(models={"m": ModelSpec(path=tiny_model, block_size=BLOCK)}) as e:
            out = await e.generate(
                prompt, SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
            )
            await wait_all_free(e)
            return out, e.stats()["m"]

    out, stats = anyio.run(main)
    samples = out.completions
    assert len(samples) == 4 and out.token_ids == samples[0].token_ids
    assert [s.request_id for s in samples] == [out.request_id] + [f"{out.request_id}/{i}" for i in (1, 2, 3)]
    assert samples[0].num_cached_prompt_tokens == 0
    assert all(s.num_cached_prompt_tokens == full for s in samples[1:])
    # the prompt went through the model once, plus each later sample's partial block
    assert samples[0].tokens_processed["m"] == len(prompt) + 11
    assert all(s.tokens_processed["m"] == len(prompt) - full + 11 for s in samples[1:])
    assert stats.tokens_processed == len(prompt) + 3 * (len(prompt) - full) + 4 * 11
    assert stats.prefix_cache_hit_tokens == 3 * full
    assert len({tuple(s.token_ids) for s in samples}) > 1, "each sample has its own seed stream"


def test_samples_are_reproducible_and_the_first_is_the_single_request(tiny_model):
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10)

    async def main():
        async with Engine(models={"m": tiny_model}) as e:
            a = await e.generate("Once upon a time", params)
            b = await e.generate("Once upon a time", params)
            one = await e.generate("Once upon a time", params.model_copy(update={"n": 1}))
            return a, b, one

    a, b, one = anyio.run(main)
    assert [s.token_ids for s in a.completions] == [s.token_ids for s in b.completions]
    assert a.token_ids == one.token_ids and one.completions == []


def test_routed_samples_stream_by_index_and_free_everything(tiny_pair):
    specs = {m: ModelSpec(path=p, block_size=BLOCK) for m, p in tiny_pair.items()}
    prompt = _prompt(3 * BLOCK + 2)

    async def main():
        async with Engine(models=specs, policy=RStitch(tau=TINY_PAIR_TAU)) as e:
            texts, ids, finals = {}, {}, {}
            async for d in e.stream(prompt, SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=20)):
                texts[d.index] = texts.get(d.index, "") + d.text
                ids.setdefault(d.index, []).extend(d.token_ids)
                if d.finish_reason is not None:
                    finals[d.index] = d.output
            await wait_all_free(e)
            return texts, ids, finals

    texts, ids, finals = anyio.run(main)
    assert sorted(finals) == [0, 1, 2, 3]
    for i, out in finals.items():
        assert texts[i] == out.text and ids[i] == out.token_ids
    assert sum(out.num_handoffs for out in finals.values()) > 0


def test_aborting_the_request_ends_every_sample(tiny_model):
    async def main():
        async with Engine(models={"m": tiny_model}) as e:
            params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=10**6, ignore_eos=True)
            result = {}

            async def run():
                result["out"] = await e.generate(_prompt(40), params, request_id="fam")

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await wait_until(lambda: e.stats()["m"].running == 3, timeout=120, what="all three samples running")
                await e.abort("fam")
            await wait_all_free(e)
            return result["out"]

    out = anyio.run(main)
    assert [s.finish_reason for s in out.completions] == ["abort"] * 3


@pytest.mark.parametrize("n", [2, 5])
def test_greedy_samples_are_all_the_greedy_answer(tiny_model, n):
    async def main():
        async with Engine(models={"m": tiny_model}) as e:
            many = await e.generate("Hello there", SamplingParams(n=n, temperature=0, max_tokens=8))
            one = await e.generate("Hello there", SamplingParams(temperature=0, max_tokens=8))
            return many, one

    many, one = anyio.run(main)
    assert [s.token_ids for s in many.completions] == [one.token_ids] * n
