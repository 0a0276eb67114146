"""Routing runtime: engine == reference under concurrency, catch-up cost, frees, policy faults."""

import random

import anyio
import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import EveryK, wait_all_free, wait_until
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.policies import RStitch
from tokenrouter.testing import build_tiny_model, load_reference_models, reference_generate

TAU = TINY_PAIR_TAU


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair


@pytest.fixture(scope="module")
def ref_models(pair):
    return load_reference_models(pair, torch.float64)


def _specs(pair, **kw):
    base = {"dtype": "float64", "kv_cache_tokens": 4096, "block_size": 8, "max_num_batched_tokens": 128}
    base.update(kw)
    return {name: ModelSpec(path=path, **base) for name, path in pair.items()}


def _workload(seed, n, vocab):
    rng = random.Random(seed)
    return [
        {
            "prompt": [rng.randrange(3, vocab) for _ in range(rng.choice([2, 5, 11, 23, 47]))],
            "max_tokens": rng.randint(4, 40),
            "delay": rng.uniform(0, 0.03),
        }
        for _ in range(n)
    ]


def _run(policy, specs, reqs, **engine_kw):
    outs = {}

    async def main():
        async with Engine(models=specs, policy=policy, **engine_kw) as engine:

            async def one(i, r):
                await anyio.sleep(r["delay"])
                params = SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
                outs[i] = await engine.generate(r["prompt"], params)

            async with anyio.create_task_group() as tg:
                for i, r in enumerate(reqs):
                    tg.start_soon(one, i, r)
            await wait_all_free(engine)
            assert all(s.pending == 0 for s in engine.stats().values())
            outs["stats"] = engine.stats()

    anyio.run(main)
    return outs


@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_rstitch_equals_reference(pair, ref_models, tokenizer, concurrency):
    policy = RStitch(tau=TAU, small="small", large="large")
    reqs = _workload(concurrency, concurrency, len(tokenizer))
    outs = _run(policy, _specs(pair), reqs)
    handoffs = 0
    for i, r in enumerate(reqs):
        ref = reference_generate(
            policy, ref_models, r["prompt"], SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
        )
        out = outs[i]
        assert out.token_ids == ref.token_ids, f"request {i}: tokens differ {out.finish_reason} {out.error}"
        assert out.token_models == ref.token_models, f"request {i}: attribution differs"
        assert out.num_handoffs == ref.num_handoffs
        # Catch-up: each model processed the prompt plus the tokens it had not seen, never more.
        assert out.tokens_processed == ref.context_at_last_step, f"request {i}"
        handoffs += out.num_handoffs
    written = [m for i in range(len(reqs)) for m in outs[i].token_models]
    assert written.count("small") > 0 and written.count("large") > 0
    stats = outs["stats"]
    assert stats["large"].handoffs_received > 0 and stats["small"].handoffs_received > 0
    assert handoffs >= len(reqs)  # routing happened in both directions, many times


def test_custom_policy_equals_reference(pair, ref_models, tokenizer):
    policy = EveryK(3)
    reqs = _workload(5, 12, len(tokenizer))
    outs = _run(policy, _specs(pair), reqs)
    for i, r in enumerate(reqs):
        ref = reference_generate(
            policy, ref_models, r["prompt"], SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
        )
        assert outs[i].token_ids == ref.token_ids
        assert outs[i].token_models == ref.token_models
        assert outs[i].token_models[:3] == ["small"] * min(3, r["max_tokens"])
        assert outs[i].tokens_processed == ref.context_at_last_step


def test_eviction_of_pending_requests_keeps_outputs(pair, ref_models, tokenizer):
    """Small pools plus a large model that holds requests back: pending blocks get evicted."""
    policy = RStitch(tau=TAU, small="small", large="large")
    reqs = _workload(11, 16, len(tokenizer))
    specs = _specs(pair, kv_cache_tokens=240)
    outs = _run(policy, specs, reqs, delayed_batching={"large": 8}, batch_wait_s=0.05)
    stats = outs["stats"]
    assert stats["small"].evictions + stats["large"].evictions > 0
    for i, r in enumerate(reqs):
        ref = reference_generate(
            policy, ref_models, r["prompt"], SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
        )
        assert outs[i].token_ids == ref.token_ids
        assert outs[i].token_models == ref.token_models
        for model, n in outs[i].tokens_processed.items():
            assert n >= ref.context_at_last_step[model]


def test_abort_while_pending_and_while_streaming_frees_everything(pair, tokenizer):
    """The large model holds its requests back (delayed batching), so requests sit pending on the small one."""
    policy = RStitch(tau=TAU, small="small", large="large")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, len(tokenizer)) for _ in range(9)] for _ in range(12)]

    async def main():
        async with Engine(
            models=_specs(pair), policy=policy, delayed_batching={"large": 64}, batch_wait_s=0.3
        ) as engine:
            params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            results = {}

            async def gen(i):
                results[i] = await engine.generate(prompts[i], params, request_id=f"r{i}")

            async def streamed(i):
                n = 0
                async for d in engine.stream(prompts[i], params, request_id=f"r{i}"):
                    n += len(d.token_ids)
                    if n >= 3:
                        break

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(gen, i)
                for i in range(8, 12):
                    tg.start_soon(streamed, i)
                # (a deadline, not a count of polls: on a loaded machine the first hand-off can take seconds)
                await wait_until(lambda: engine.stats()["small"].pending > 0, 60, "a request pending at a peer")
                for i in range(8):
                    await engine.abort(f"r{i}")
            assert all(results[i].finish_reason == "abort" for i in range(8))
            await wait_all_free(engine)
            st = engine.stats()
            assert st["small"].pending == 0 and st["large"].pending == 0
            out = await engine.generate(prompts[0], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
            assert len(out.token_ids) == 5

    anyio.run(main)


class Explodes(RStitch):
    def route(self, result):
        if any(rid.startswith("boom") for rid in result.request_ids):
            raise ZeroDivisionError("policy bug")
        return super().route(result)


def test_policy_exception_fails_only_that_call(pair):
    policy = Explodes(tau=TAU, small="small", large="large")

    async def main():
        async with Engine(models=_specs(pair), policy=policy) as engine:
            params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
            bad = await engine.generate([5, 6, 7], params, request_id="boom-1")
            assert bad.finish_reason == "error"
            assert "ZeroDivisionError" in bad.error and "policy bug" in bad.error
            good = await engine.generate([5, 6, 7], params)
            assert good.finish_reason == "length" and len(good.token_ids) == 10
            await wait_all_free(engine)
            assert all(s.alive for s in engine.stats().values())

    anyio.run(main)


def test_mismatched_tokenizers_are_rejected(pair, tmp_path):
    from tokenrouter.errors import ConfigError
    from tokenrouter.testing import build_tokenizer

    other = build_tiny_model(tmp_path / "other", "qwen2", tokenizer=build_tokenizer(vocab_size=300))

    async def main():
        async with Engine(
            models={"small": pair["small"], "large": other}, policy=RStitch(small="small", large="large")
        ):
            pass

    with pytest.raises(ConfigError, match="different tokenizers") as e:
        anyio.run(main)
    assert "'small'" in str(e.value) and "'large'" in str(e.value)


@pytest.mark.parametrize("mode, prefix_caching", [("standard", False), ("standard", True), ("lockstep", True)])
def test_baseline_modes_give_the_same_tokens(pair, ref_models, tokenizer, mode, prefix_caching):
    """The baselines differ from the routed engine in cost only, never in output."""
    policy = RStitch(tau=TAU, small="small", large="large")
    reqs = _workload(21, 8, len(tokenizer))
    outs = _run(policy, _specs(pair, enable_prefix_caching=prefix_caching), reqs, mode=mode)
    reprefilled = 0
    for i, r in enumerate(reqs):
        ref = reference_generate(
            policy, ref_models, r["prompt"], SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
        )
        assert outs[i].token_ids == ref.token_ids
        assert outs[i].token_models == ref.token_models
        fed = sum(outs[i].tokens_processed.values())
        assert fed >= sum(ref.context_at_last_step.values())
        reprefilled += fed - sum(ref.context_at_last_step.values())
    if mode == "standard" and not prefix_caching:
        assert reprefilled > 0  # every hand-off re-processed the whole sequence
    if mode == "lockstep":
        assert reprefilled == 0


def test_policy_requiring_an_unknown_field_is_rejected(pair):
    from tokenrouter.errors import ConfigError

    class WantsAttention(RStitch):
        requires = frozenset({"entropy", "attention_maps"})

    with pytest.raises(ConfigError, match="attention_maps"):
        Engine(models=pair, policy=WantsAttention(small="small", large="large"))
