"""Paged KV pool: prefix sharing, preemption with recompute, and every block free at the end."""

import random

import anyio
import pytest

from tests.helpers import generate_all, hf_greedy, wait_all_free
from tokenrouter import Engine, EngineNotRunningError, InvalidRequestError, ModelSpec, SamplingParams
from tokenrouter.engine import Request, Sequence
from tokenrouter.engine.kv import BlockManager


def _seq(tokens):
    return Sequence(Request("r", list(tokens), SamplingParams(), 0, frozenset(), 10), token_ids=list(tokens))


def test_block_manager_prefix_sharing_and_free():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _seq(range(10))  # blocks [0..3] [4..7] [8, 9]
    bm.match_prefix(a)
    assert a.num_computed == 0
    assert bm.grow(a, 10) and len(a.block_table) == 3
    a.num_computed = 10
    bm.register_full_blocks(a)
    b = _seq(list(range(8)) + [99, 98, 97])
    bm.match_prefix(b)
    assert b.num_computed == 8 and b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2
    # A prompt that is exactly the cached blocks still computes its last token itself.
    c = _seq(range(8))
    bm.match_prefix(c)
    assert c.num_computed == 4
    for s in (a, b, c):
        bm.free(s)
    assert bm.num_free == 8
    # Freed blocks keep their content for later hits until reused.
    d = _seq(range(9))
    bm.match_prefix(d)
    assert d.num_computed == 8
    bm.free(d)


def test_forgetting_free_prefixes_keeps_blocks_in_use():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = _seq(range(9)), _seq(range(100, 109))
    for s in (a, b):
        bm.grow(s, 9)
        s.num_computed = 9
        bm.register_full_blocks(s)
    bm.free(a)  # a's two full blocks are free but cached; b still uses its own
    assert bm.forget_free_prefixes() == 2
    again = _seq(range(9))
    bm.match_prefix(again)
    assert again.num_computed == 0  # cold
    shares_b = _seq(range(100, 109))
    bm.match_prefix(shares_b)
    assert shares_b.num_computed == 8  # blocks in use keep their prefix
    bm.free(shares_b)
    bm.free(b)
    assert bm.num_free == 8


def test_engine_reset_prefix_cache_makes_a_repeat_cold(tiny_model):
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=512, block_size=8)
    prompt = list(range(5, 45))

    async def main():
        async with Engine(models={"m": spec}) as engine:
            params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
            first = await engine.generate(prompt, params)
            hot = await engine.generate(prompt, params)
            forgotten = await engine.reset_prefix_cache()
            cold = await engine.generate(prompt, params)
        assert hot.token_ids == first.token_ids == cold.token_ids
        assert forgotten["m"] > 0
        assert hot.tokens_processed["m"] < len(prompt) and cold.tokens_processed["m"] >= len(prompt)
        with pytest.raises(EngineNotRunningError):
            await engine.reset_prefix_cache()

    anyio.run(main)


def test_block_manager_refuses_when_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = _seq(range(20))
    assert not bm.grow(a, 12)
    assert a.block_table == [] and bm.num_free == 2


def test_preemption_and_prefix_sharing_keep_outputs_and_free_all(tiny_model, tokenizer):
    rng = random.Random(7)
    vocab = len(tokenizer)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    prompts = [shared + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))] for _ in range(10)]
    prompts += [[rng.randrange(3, vocab) for _ in range(rng.randint(5, 30))] for _ in range(4)]
    max_tokens = [rng.randint(20, 45) for _ in prompts]
    # 20 blocks of 8 = 160 tokens: far less than 14 requests need at once, so preemption must happen.
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=160, block_size=8, max_num_batched_tokens=64)
    outs = {}

    async def main():
        async with Engine(models={"m": spec}) as engine:

            async def one(i):
                await anyio.sleep(0.002 * i)
                params = SamplingParams(temperature=0, max_tokens=max_tokens[i], ignore_eos=True)
                outs[i] = await engine.generate(prompts[i], params)

            async def aborted():
                # This one is aborted mid-way: its blocks must come back too.
                async with anyio.create_task_group() as tg:

                    async def run():
                        outs["aborted"] = await engine.generate(
                            prompts[0],
                            SamplingParams(temperature=0, max_tokens=110, ignore_eos=True),
                            request_id="to-abort",
                        )

                    tg.start_soon(run)
                    await anyio.sleep(0.05)
                    await engine.abort("to-abort")

            async def too_big():  # can never fit, even alone: refused at once, before any worker sees it
                with pytest.raises(InvalidRequestError) as info:
                    await engine.generate([5] * 300, SamplingParams(temperature=0, max_tokens=5))
                outs["too_big"] = info.value

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
                tg.start_soon(aborted)
                tg.start_soon(too_big)
            await wait_all_free(engine)
            stats = engine.stats()["m"]
            assert stats.preemptions > 0, "the pool was meant to force preemption"
            assert stats.prefix_cache_hit_tokens > 0, "the shared prefix was meant to be reused"

    anyio.run(main)
    assert outs["aborted"].finish_reason == "abort"
    assert outs["too_big"].field == "prompt"
    assert "needs KV for 305 tokens (prompt 300 + max_tokens 5)" in str(outs["too_big"])
    assert "pool holds 160 tokens" in str(outs["too_big"])
    assert any(outs[i].num_cached_prompt_tokens > 0 for i in range(10))
    for i, p in enumerate(prompts):
        assert outs[i].token_ids == hf_greedy(tiny_model, p, max_tokens[i]), f"request {i} differs"


@pytest.mark.parametrize("budget", [{"kv_cache_tokens": 64}, {"kv_cache_bytes": 64 * 2 * 2 * 2 * 16 * 8}])
def test_budget_in_tokens_or_bytes(tiny_model, budget):
    # tiny qwen2: 2 layers x 2 kv heads x 16 dims, float64: 2*2*2*16*8 = 1024 bytes per token
    spec = ModelSpec(path=tiny_model, dtype="float64", block_size=8, **budget)

    async def main():
        async with Engine(models={"m": spec}) as engine:
            st = engine.stats()["m"]
            assert st.kv_blocks_total * st.kv_block_size == 64
            assert st.kv_cache_bytes == 64 * 1024

    anyio.run(main)


def test_a_request_too_big_for_any_pool_it_may_visit_fails_at_once(tiny_pair):
    """The small model's pool holds it, the large one's does not: refused before any worker sees it."""
    from tokenrouter import RStitch

    specs = {
        "small": ModelSpec(path=tiny_pair["small"], dtype="float64", kv_cache_tokens=512, block_size=8),
        "large": ModelSpec(path=tiny_pair["large"], dtype="float64", kv_cache_tokens=64, block_size=8),
    }

    async def main():
        async with Engine(models=specs, policy=RStitch(tau=0.2)) as engine:
            with pytest.raises(InvalidRequestError) as info:
                await engine.generate([5] * 40, SamplingParams(max_tokens=30))
            assert info.value.field == "max_tokens"
            assert (
                "needs KV for 70 tokens (prompt 40 + max_tokens 30), but model 'large''s pool holds 64 tokens"
                in str(info.value)
            )
            assert all(s.steps == 0 and s.kv_blocks_free == s.kv_blocks_total for s in engine.stats().values())
            out = await engine.generate([5] * 40, SamplingParams(max_tokens=20, ignore_eos=True))
            assert len(out.token_ids) == 20  # 60 tokens fit both pools

    anyio.run(main)


def test_requests_arriving_together_compute_a_shared_prefix_once():
    from tokenrouter.engine.sched import Scheduler

    bm = BlockManager(num_blocks=32, block_size=4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    shared = list(range(100, 108))  # two full blocks
    a, b, c = (_seq(shared + [i, i + 1, i + 2]) for i in (1, 5, 9))
    other = _seq([7, 8, 9, 10, 11, 12])
    for s in (a, b, other, c):
        sched.add(s)
    batch, failed = sched.schedule()
    assert not failed and batch.seqs == [a, other] and batch.num_new == [11, 6]
    assert list(sched.waiting) == [b, c]  # deferred, first in line
    for s, n in zip(batch.seqs, batch.num_new):  # what the worker does after the forward
        s.num_computed += n
        bm.register_full_blocks(s)
    batch, _ = sched.schedule()
    assert [s for s in batch.seqs if s in (b, c)] == [b, c]
    assert b.num_cached_prompt == c.num_cached_prompt == 8
    assert b.block_table[:2] == c.block_table[:2] == a.block_table[:2]


def test_shared_prefix_computed_once_in_the_engine_and_outputs_unchanged(tiny_model, tokenizer):
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=2048, block_size=8)
    shared = list(range(5, 45))  # five full blocks
    prompts = [shared + [50 + i, 60 + i, 70 + i] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main():
        async with Engine(models={"m": spec}) as engine:
            outs = await generate_all(engine, prompts, params)
            await wait_all_free(engine)
            return outs, engine.stats()["m"]

    outs, stats = anyio.run(main)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(tiny_model, p, 5)
    # the shared 40 tokens once, then each request's own 3 prompt tokens and 4 more decodes
    assert stats.tokens_processed == len(shared) + len(prompts) * (3 + 4)
    assert stats.prefix_cache_hit_tokens == len(shared) * (len(prompts) - 1)
