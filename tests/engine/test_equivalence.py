"""Invariant 1: one model, greedy, the engine's tokens equal Hugging Face generate."""

import random

import anyio
import pytest

from tests.helpers import hf_greedy, wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams


def _workload(seed: int, n: int, vocab: int):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        plen = rng.choice([1, 3, 9, 17, 33, 70, 140])
        reqs.append(
            {
                "prompt": [rng.randrange(3, vocab) for _ in range(plen)],
                "max_tokens": rng.randint(1, 40),
                "delay": rng.uniform(0, 0.05) * (i % 4),
            }
        )
    return reqs


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral-sliding"])
def test_greedy_equals_hf_generate_under_concurrency(tiny_models, tokenizer, arch):
    path = tiny_models[arch]
    reqs = _workload(seed=hash(arch) % 1000, n=16, vocab=len(tokenizer))
    spec = ModelSpec(path=path, dtype="float64", kv_cache_tokens=4096, block_size=8, max_num_batched_tokens=96)
    results = {}

    async def one(engine, i, r):
        await anyio.sleep(r["delay"])
        out = await engine.generate(
            r["prompt"], SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
        )
        results[i] = out

    async def main():
        async with Engine(models={"m": spec}) as engine:
            async with anyio.create_task_group() as tg:
                for i, r in enumerate(reqs):
                    tg.start_soon(one, engine, i, r)
            await wait_all_free(engine)
            stats = engine.stats()["m"]
            assert max(stats.batch_size_histogram) > 1, "requests were never batched together"

    anyio.run(main)
    for i, r in enumerate(reqs):
        out = results[i]
        assert out.finish_reason == "length"
        assert out.token_models == ["m"] * r["max_tokens"]
        assert out.token_ids == hf_greedy(path, r["prompt"], r["max_tokens"]), f"request {i} differs"
