"""Verifying policies (policies/base.py VERIFY): speculative decoding and BiLD inside the routing
runtime. The verifier's catch-up over the drafter's tokens verifies them; rejected ones roll back
everywhere; the caller sees only accepted tokens."""

from __future__ import annotations

import random

import anyio
import pytest
import torch

from tests.helpers import generate_all, hf_greedy, hf_greedy_penalized, holds_nothing, penalized_logits, wait_all_free
from tokenrouter import ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.policies import BiLD, Single, Speculative
from tokenrouter.testing import workers_of

K_VALUES = [1, 2, 4, 8, "auto"]


def _specs(pair, **kw):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=4096, block_size=8, **kw) for n, p in pair.items()}


def _workload(tokenizer, n=16, seed=7):
    """Mixed prompt and output lengths."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, len(tokenizer)) for _ in range(rng.choice([3, 9, 17, 30]))], rng.randint(5, 40))
        for _ in range(n)
    ]


@pytest.mark.parametrize("k", K_VALUES)
def test_greedy_speculative_equals_the_large_model_alone(tiny_pair, tokenizer, k, monkeypatch, tmp_path):
    """Token for token against Hugging Face generate on the large model, 16 requests at once."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))  # k="auto" profiles the models: cache them here
    work = _workload(tokenizer)
    outs, _ = _serve(_specs(tiny_pair), Speculative(k=k), work)
    for (prompt, n), out in zip(work, outs):
        ref = hf_greedy(tiny_pair["large"], prompt, n)
        assert out.token_ids == ref, (prompt, n)
        assert out.finish_reason == "length"
        assert set(out.token_models) <= {"small", "large"} and len(out.token_models) == len(out.token_ids)


@pytest.mark.cpu_levels
def test_greedy_speculative_is_the_target_alone_on_the_gguf_block_kernels(tokenizer, monkeypatch, tmp_path):
    """In the default CPU precision's arithmetic (the GGUF block kernels, float32 between them over
    a float16 KV cache) the verifier's logits over k + 1 tokens are the target's own decode
    logits, bit for bit, so greedy Speculative writes the target's output whatever the batching,
    at every CPU level: the block kernels and the C attention kernel compute each row alone, in an
    order fixed per level. Against the engine's target alone in the same mode (Hugging Face's
    arithmetic is other)."""
    _speculative_is_the_target_alone_on_blocks(tokenizer, monkeypatch, tmp_path, "float32")


def test_greedy_speculative_is_the_target_alone_in_bf16_on_the_gguf_block_kernels(tokenizer, monkeypatch, tmp_path):
    """The same with bf16 between the block kernels (the precision a CPU with fast bf16 may take)."""
    _speculative_is_the_target_alone_on_blocks(tokenizer, monkeypatch, tmp_path, "bfloat16")


def _speculative_is_the_target_alone_on_blocks(tokenizer, monkeypatch, tmp_path, dtype: str) -> None:
    from tokenrouter.engine.quant import gguf_native, probe
    from tokenrouter.testing import build_tiny_model, write_gguf

    lib = gguf_native.load()[0]
    if lib is None:
        pytest.skip(f"no GGUF block kernels here: {gguf_native.load()[1]}")
    monkeypatch.setattr(probe, "few_kernel", lambda timings: "blocks")  # the probe's pick, forced
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    kw = {
        "tokenizer": tokenizer,
        "logit_scale": 3.0,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
    }
    pair = {
        "small": build_tiny_model(tmp_path / "small", "qwen2", seed=1, **kw),
        "large": build_tiny_model(
            tmp_path / "large", "qwen2", seed=2, num_hidden_layers=3, num_key_value_heads=2, **kw
        ),
    }
    for path in pair.values():
        write_gguf(path)  # Q8_0 blocks: rows of 64 and 128 are no whole 256-blocks
    specs = {
        n: ModelSpec(path=p, dtype=dtype, quantization="gguf", kv_cache_tokens=4096, block_size=8)
        for n, p in pair.items()
    }
    work = _workload(tokenizer, n=12, seed=3)
    alone, _ = _serve({"large": specs["large"]}, Single("large"), work)
    for k in (1, 4):
        outs, _ = _serve(specs, Speculative(k=k), work)
        assert [o.token_ids for o in outs] == [o.token_ids for o in alone], k


async def _all(engine, work):
    """Every (prompt, n) of `work` at once, greedy, exactly n tokens each."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in work]
    return await generate_all(engine, [prompt for prompt, _ in work], params)


def _serve(specs, policy, work, **engine_kw) -> tuple[list, dict]:
    """`work` through an engine: the outputs and the workers' stats; every block free
    afterwards, checked."""

    async def main():
        async with Engine(models=specs, policy=policy, **engine_kw) as e:
            outs = await _all(e, work)
            await wait_all_free(e)
            assert holds_nothing(e)
            return outs, e.stats()

    return anyio.run(main)


def test_verifying_policies_are_checked_at_construction(tiny_pair):
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        Engine(models=_specs(tiny_pair, max_num_batched_tokens=4), policy=Speculative(k=8))
    with pytest.raises(ConfigError, match="k must be"):
        Speculative(k=0)
    with pytest.raises(ConfigError, match="fallback"):
        BiLD(fallback=1.5)


def test_bild_runs_and_frees_everything(tiny_pair, tokenizer):
    """The tiny pair's models are unrelated and the large one is peaked (-log p of the small
    model's token is often > 10 nats), so only a wide rollback threshold keeps small tokens."""
    work = _workload(tokenizer, n=8)
    outs, _ = _serve(_specs(tiny_pair), BiLD(fallback=0.5, rollback=20.0), work)
    for (_, n), out in zip(work, outs):
        assert out.finish_reason == "length" and len(out.token_ids) == n
    assert any("small" in o.token_models for o in outs) and any("large" in o.token_models for o in outs)


def _reference(tiny_pair, policy, work, params_of):
    from tokenrouter.testing import load_reference_models, reference_generate

    models = load_reference_models(tiny_pair, dtype=torch.float64)
    return [reference_generate(policy, models, prompt, params_of(i, n)) for i, (prompt, n) in enumerate(work)]


@pytest.mark.parametrize(
    "policy, temperature",
    [
        (BiLD(fallback=0.5, rollback=20.0), 0.0),
        (BiLD(fallback=0.4, rollback=15.0, max_draft=3), 0.0),
        (Speculative(k=3), 0.8),
        (BiLD(fallback=0.3, rollback=6.0), 0.9),
    ],
    ids=["bild-greedy", "bild-greedy-short-drafts", "speculative-sampled", "bild-sampled"],
)
def test_engine_equals_the_slow_reference(tiny_pair, tokenizer, policy, temperature):
    """Tokens and who wrote each, against `reference_generate` (the policy run the slow, obvious
    way), 16 requests at once; sampled requests are seeded, so they match too."""
    work = _workload(tokenizer, seed=11)

    def params_of(i, n):
        return SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, seed=1000 + i)

    async def main():
        async with Engine(models=_specs(tiny_pair), policy=policy) as e:
            outs = await generate_all(e, [p for p, _ in work], [params_of(i, n) for i, (_, n) in enumerate(work)])
            await wait_all_free(e)
            return outs

    outs = anyio.run(main)
    refs = _reference(tiny_pair, policy, work, params_of)
    for out, ref in zip(outs, refs):
        assert out.token_ids == ref.token_ids
        assert out.token_models == ref.token_models
        assert out.finish_reason == ref.finish_reason
    written = [m for out in outs for m in out.token_models]
    assert "small" in written and "large" in written  # both models' tokens survive, so rollback was partial


class CachedBlocksWatch:
    """Snapshots every block's KV when it enters a model's prefix cache (its `blocks`, over the
    tensors of its KV `cache`); `changed()` lists the blocks that still carry that entry but whose
    KV no longer equals the snapshot (an in-place write)."""

    def __init__(self, blocks, cache):
        self.blocks, self.cache, self.seen = blocks, cache, {}
        real = blocks.register_full_blocks

        def register(seq):
            before = set(seq.block_table[: seq.num_hashed_blocks])
            real(seq)
            for block_id in seq.block_table[: seq.num_hashed_blocks]:
                key = blocks.block_keys[block_id]
                if block_id not in before and key is not None and (block_id, key) not in self.seen:
                    self.seen[(block_id, key)] = self._kv(block_id)

        blocks.register_full_blocks = register

    def _kv(self, block_id):
        bs = self.blocks.block_size
        return [t[block_id * bs : (block_id + 1) * bs].clone() for t in (*self.cache.k, *self.cache.v)]

    def changed(self) -> list[int]:
        keys = self.blocks.block_keys
        return [
            b
            for (b, key), snap in self.seen.items()
            if keys[b] == key and any(not torch.equal(a, c) for a, c in zip(snap, self._kv(b)))
        ]


def test_rollback_never_changes_a_cached_block_and_shared_prefixes_stay_correct(tiny_pair, tokenizer):
    """Small blocks, so drafts that are later rejected fill blocks that enter the prefix cache;
    a second wave of requests shares prefixes (and whole prompts) with the first. Every output is
    the large model's, and no cached block's KV was ever written in place."""
    rng = random.Random(5)
    shared = [rng.randrange(3, len(tokenizer)) for _ in range(13)]
    first = [
        (shared + [rng.randrange(3, len(tokenizer)) for _ in range(rng.randint(0, 6))], rng.randint(8, 24))
        for _ in range(8)
    ]
    second = [(p + [rng.randrange(3, len(tokenizer))], n) for p, n in first[:4]] + first[4:]
    specs = {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=8192, block_size=4) for n, p in tiny_pair.items()}

    async def main():
        async with Engine(models=specs, policy=Speculative(k=4)) as e:
            watches = [CachedBlocksWatch(w.core.blocks, w.core.cache) for w in workers_of(e).values()]
            outs = await _all(e, first) + await _all(e, second)
            await wait_all_free(e)
            return outs, watches, {m: s.prefix_cache_hit_tokens for m, s in e.stats().items()}

    outs, watches, hits = anyio.run(main)
    assert hits["large"] > 0  # the second wave did reuse cached blocks
    for (prompt, n), out in zip(first + second, outs):
        assert out.token_ids == hf_greedy(tiny_pair["large"], prompt, n)
    assert sum(len(w.seen) for w in watches) > 0
    assert [w.changed() for w in watches] == [[], []]


SAMPLES = 3000


def _exact_two_tokens(model_path, prompt, params) -> dict[tuple[int, int], float]:
    """The target's exact distribution of its first two tokens under `params` (top-k keeps it small)."""
    from transformers import AutoModelForCausalLM

    from tokenrouter.sampling import Sampler, SamplingTensors

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
    sampler = Sampler()

    def probs(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1:]
        p = sampler.probs(logits, SamplingTensors.build([params], [0], [0], logits.device))[0].double()
        return p / p.sum()

    first = probs(prompt)
    joint = {}
    for t1 in first.nonzero().flatten().tolist():
        second = probs(prompt + [t1])
        for t2 in second.nonzero().flatten().tolist():
            joint[(t1, t2)] = float(first[t1] * second[t2])
    return joint


def _chi_square_p(observed: dict, expected: dict, n: int) -> float:
    """p-value of a chi-square goodness-of-fit test (cells expecting fewer than 5 pooled)."""
    cells, pooled_o, pooled_e = [], 0, 0.0
    for key, p in expected.items():
        e = n * p
        if e < 5:
            pooled_o, pooled_e = pooled_o + observed.get(key, 0), pooled_e + e
        else:
            cells.append((observed.get(key, 0), e))
    outside = n - sum(observed.get(k, 0) for k in expected)  # outcomes the target never gives
    cells.append((pooled_o + outside, pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 0) + (1e9 if outside else 0)
    df = len(cells) - 1
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_sampling_draws_from_the_target(tiny_pair, k):
    """Thousands of seeds: the first two tokens under Speculative are distributed as the target's
    own (exact, computed from the target alone), by a chi-square test at p > 0.01."""
    prompt = [17, 40, 9, 101, 33]
    params = SamplingParams(temperature=1.0, top_k=6, max_tokens=2, ignore_eos=True)
    expected = _exact_two_tokens(tiny_pair["large"], prompt, params)

    counts = _seeded_counts(_specs(tiny_pair, max_num_seqs=64), Speculative(k=k), prompt, params)
    assert sum(counts.values()) == SAMPLES
    assert _chi_square_p(counts, expected, SAMPLES) > 0.01, (counts, expected)


def _seeded_counts(specs, policy, prompt, params, check=None) -> dict:
    """How often each output comes out of SAMPLES seeds of `params`, all in flight at once
    (`check(engine)` first, where given)."""

    async def main():
        counts: dict = {}
        async with Engine(models=specs, policy=policy) as e:
            if check is not None:
                check(e)

            async def one(seed):
                out = await e.generate(prompt, params.model_copy(update={"seed": seed}))
                counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1

            async with anyio.create_task_group() as tg:
                for seed in range(SAMPLES):
                    tg.start_soon(one, seed)
            await wait_all_free(e)
        return counts

    return anyio.run(main)


def test_a_draft_scoring_part_of_the_vocabulary_keeps_speculative_exact(drafting_pair, tiny_pair, tokenizer):
    """ModelSpec(draft_vocab=N) on the drafter (its head scores ids below N only): greedy
    Speculative is still Hugging Face generate on the large model, token for token, and the
    drafter's proposals lose only the tokens it cannot name; sampled, the first two tokens are
    still distributed as the target's (chi-square, as above), with N cutting through the
    target's likeliest first tokens so that some of them are ones the drafter never proposes."""
    work = _workload(tokenizer, n=8, seed=5)
    specs = _specs(drafting_pair)
    specs["small"] = specs["small"].model_copy(update={"draft_vocab": len(tokenizer) // 2})
    outs, stats = _serve(specs, Speculative(k=4), work)
    for (prompt, n), out in zip(work, outs):
        assert out.token_ids == hf_greedy(drafting_pair["large"], prompt, n), (prompt, n)
    assert sum(o.token_models.count("small") for o in outs) > 0  # accepted drafts: the narrow head served

    prompt = [17, 40, 9, 101, 33]
    params = SamplingParams(temperature=1.0, top_k=6, max_tokens=2, ignore_eos=True)
    expected = _exact_two_tokens(tiny_pair["large"], prompt, params)
    firsts = sorted({a for a, _ in expected})
    cut = firsts[len(firsts) // 2]  # the drafter can name only the lower half of them
    specs = _specs(tiny_pair, max_num_seqs=64)
    specs["small"] = specs["small"].model_copy(update={"draft_vocab": cut})

    def narrowed(e):
        assert e.info().models["small"].linear_kernel.endswith(f"+head-first-{cut}")

    counts = _seeded_counts(specs, Speculative(k=2), prompt, params, narrowed)
    assert _chi_square_p(counts, expected, SAMPLES) > 0.01, (counts, expected)


@pytest.fixture(scope="module")
def drafting_pair(tiny_pair, tmp_path_factory):
    """The tiny pair's large model and, as drafter, a perturbed copy of it: unlike two random
    models they agree on most tokens, so drafts are accepted, partly accepted and rejected."""
    from tokenrouter.testing import build_perturbed_copy

    root = tmp_path_factory.mktemp("drafting")
    return {"small": build_perturbed_copy(tiny_pair["large"], root / "small", noise=0.01), "large": tiny_pair["large"]}


def _with_eos(pair: dict, eos: int, root) -> dict:
    """Copies of both models whose generation config names `eos` as end of sequence."""
    import json
    import shutil

    out = {}
    for name, path in pair.items():
        dest = root / name
        shutil.copytree(path, dest)
        config = json.loads((dest / "generation_config.json").read_text())
        config["eos_token_id"] = [eos]
        (dest / "generation_config.json").write_text(json.dumps(config))
        out[name] = dest
    return out


STOP_PROMPTS = [[17, 40, 9, 101, 33], [250, 3, 77], [5, 6, 7, 8, 9, 10, 11, 12, 13], [300, 12]]


def _stop_strings(large) -> list[tuple]:
    """Per prompt, a two-character stop string from the large model's own answer (served alone,
    whose text the detokenizer tests check), placed from its fourth token on, and that run's
    text and tokens with the stop applied: (prompt, stop, text, token ids)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    async def main():
        async with Engine(models={"large": _specs({"large": large})["large"]}) as e:
            found = []
            for prompt in STOP_PROMPTS:
                text = (await e.generate(prompt, params)).text
                start = len((await e.generate(prompt, params.model_copy(update={"max_tokens": 3}))).text)
                piece = next(
                    (
                        text[i : i + 2]
                        for i in range(start, len(text) - 1)
                        if "\ufffd" not in text[i : i + 2]
                        and text[i : i + 2].strip()
                        and text.find(text[i : i + 2]) == i
                    ),
                    None,
                )
                if piece is not None:
                    out = await e.generate(prompt, params.model_copy(update={"stop": [piece]}))
                    assert out.finish_reason == "stop" and out.text == text[: text.index(piece)]
                    found.append((prompt, piece, out.text, out.token_ids))
            return found

    found = anyio.run(main)
    assert len(found) >= 2
    return found


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculative_stops_where_the_large_model_does(drafting_pair, tokenizer, k, tmp_path):
    """EOS, a stop token, a stop string and max_tokens falling at every position of a draft: the
    output is Hugging Face generate's on the large model cut where it would stop, and the small
    model did write accepted tokens (so stops inside accepted drafts were reached)."""
    bases = [hf_greedy(drafting_pair["large"], p, 24) for p in STOP_PROMPTS]
    cases = []  # (pair, prompt, params, expected token ids, finish reason)
    for prompt, base in zip(STOP_PROMPTS, bases):
        for at in (3, 6, 9, 14):
            stop_id = base[at]
            cut = base[: base.index(stop_id) + 1]
            cases.append(
                ("plain", prompt, {"max_tokens": 24, "ignore_eos": True, "stop_token_ids": [stop_id]}, cut, "stop")
            )
            cases.append(("plain", prompt, {"max_tokens": at + 1, "ignore_eos": True}, base[: at + 1], "length"))
    eos = bases[0][7]
    eos_pair = _with_eos(drafting_pair, eos, tmp_path)
    for prompt in STOP_PROMPTS:
        ref = hf_greedy(eos_pair["large"], prompt, 24, eos=eos)  # independent: HF stops at EOS itself
        cases.append(("eos", prompt, {"max_tokens": 24}, ref, "stop" if eos in ref else "length"))
    assert sum(c[0] == "eos" and c[4] == "stop" for c in cases) >= 1
    stop_cases = _stop_strings(drafting_pair["large"])

    async def main():
        results = {}
        for which, pair in (("plain", drafting_pair), ("eos", eos_pair)):
            async with Engine(models=_specs(pair), policy=Speculative(k=k)) as e:
                todo = [(i, c) for i, c in enumerate(cases) if c[0] == which]
                extra = [(f"s{j}", s) for j, s in enumerate(stop_cases)] if which == "plain" else []

                async def one(key, case):
                    if isinstance(key, str):
                        prompt, piece, _, _ = case
                        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[piece])
                    else:
                        prompt, params = case[1], SamplingParams(temperature=0, **case[2])
                    results[key] = await e.generate(prompt, params)

                async with anyio.create_task_group() as tg:
                    for key, case in todo + extra:
                        tg.start_soon(one, key, case)
                await wait_all_free(e)
                assert holds_nothing(e)
        return results

    results = anyio.run(main)
    for i, (_, prompt, params, expected, reason) in enumerate(cases):
        out = results[i]
        assert (out.token_ids, out.finish_reason) == (expected, reason), (prompt, params)
        assert len(out.token_models) == len(out.token_ids)
    for j, (prompt, piece, expected_text, expected_ids) in enumerate(stop_cases):
        out = results[f"s{j}"]
        assert (out.finish_reason, out.text, out.token_ids) == ("stop", expected_text, expected_ids), (prompt, piece)
    assert any("small" in out.token_models for out in results.values())


def test_speculative_streams_concatenate_to_the_final_output(drafting_pair, tokenizer):
    """Drafts are tentative: a stream shows only accepted tokens, never takes one back, and its
    deltas add up to the final output (text, tokens and who wrote each)."""
    prompt = [{"role": "user", "content": "Write a haiku about the sea 🙂"}]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    async def main():
        async with Engine(models=_specs(drafting_pair), policy=Speculative(k=4)) as e:
            final = await e.generate(prompt, params)
            deltas = [d async for d in e.stream(prompt, params)]
            await wait_all_free(e)
        return final, deltas

    final, deltas = anyio.run(main)
    assert "".join(d.text for d in deltas) == final.text
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert [d.model for d in deltas for _ in d.token_ids] == final.token_models
    assert {"small", "large"} <= set(final.token_models)
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])


@pytest.mark.parametrize(
    "engine_kw",
    [
        {"delayed_batching": {"large": 8}, "batch_wait_s": 0.05},
        {"delayed_batching": "auto"},
    ],
    ids=["held-back-small-pools", "auto"],
)
def test_speculative_under_delayed_batching(drafting_pair, tokenizer, engine_kw, monkeypatch, tmp_path):
    """Verify rows share the large model's steps with its decodes while it holds requests back
    (fixed B, pools small enough to evict pending copies) or sizes B itself ("auto"): outputs
    are still the large model's alone, and every block comes back."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))  # auto profiles the models: cache them here
    work = _workload(tokenizer, n=16, seed=13)
    pool = 240 if "batch_wait_s" in engine_kw else 4096

    specs = {
        n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=pool, block_size=8) for n, p in drafting_pair.items()
    }
    outs, stats = _serve(specs, Speculative(k=3), work, **engine_kw)
    for (prompt, n), out in zip(work, outs):
        assert out.token_ids == hf_greedy(drafting_pair["large"], prompt, n), (prompt, n)
    assert any("small" in o.token_models for o in outs)
    if pool == 240:
        assert stats["small"].evictions + stats["large"].evictions > 0


def test_auto_draft_length_follows_acceptance_and_cost_and_retries():
    """k="auto": long drafts while drafts are cheap and accepted, none when the verifier is
    compute-bound or drafts are rejected, and drafting again after a while without drafts."""
    from tokenrouter.policies.speculative import AutoDraftLength

    auto = AutoDraftLength(8)
    auto.use_profiles(lambda b: 0.08 * (1 + b / 64), lambda n: 0.29 * max(1.0, n / 16))  # memory-bound up to 16 tokens
    assert auto.choose(1) >= 3  # the prior (0.8) and cheap drafts
    assert auto.choose(64) == 0  # at 64 rows every extra token costs a full step
    for _ in range(20):
        auto.observe(0, 4)  # every draft rejected
    assert auto.rate < 0.1 and auto.choose(1) == 0
    steps = 1
    while auto.choose(1) == 0:
        steps += 1
        assert steps < 500, "never drafts again"
    assert steps > 10  # not at once: the rejections still count for a while


def test_auto_draft_length_plans_with_the_measured_cost_of_a_check():
    """A check of b rows of k + 1 tokens keeps logits at every position, so it can cost more than
    the target's step of b * (k + 1) tokens; with the check's measured cost, k="auto" drafts
    nothing where the step table alone says drafting pays."""
    from tokenrouter.policies.speculative import AutoDraftLength

    def draft(b):
        return 0.08 * (1 + b / 64)

    def target(n):
        return 0.29 * max(1.0, n / 16)  # memory-bound up to 16 tokens

    table_only, checked = AutoDraftLength(8), AutoDraftLength(8)
    table_only.use_profiles(draft, target)
    checked.use_profiles(draft, target, lambda b, t: target(b) * (1 + 0.6 * (t - 1)))  # each token checked: 0.6 steps
    assert table_only.best(4) >= 2  # 4 rows of up to 4 tokens: one memory-bound step
    assert checked.best(4) == 0
    checked.use_profiles(draft, target, lambda b, t: target(b * t))  # the same costs as the table: the same plan
    assert checked.best(4) == table_only.best(4)


def test_auto_drafts_where_the_draft_models_catch_up_pays():
    """With lookup (requests start on the target), a draft model that never took a request in
    must take its whole sequence in before it drafts: with k="auto" the request goes to it only
    where drafting saves more over the tokens left than that costs (from the draft model's
    latency profile). Once the draft model holds a request, it drafts as planned."""
    from tokenrouter.policies import StepResult
    from tokenrouter.policies.speculative import AutoDraftLength

    def draft(n):
        return 0.01 + 0.003 * n  # a decode step of 13 ms, each more token 3 ms (a prompt's)

    def target(n):
        return 0.04 * max(1.0, n / 16)  # memory-bound up to 16 tokens

    auto = AutoDraftLength(8)
    auto.use_profiles(draft, target)
    k, speed = auto.plan(1)
    assert k >= 2 and speed > 1.3
    saving = 1 - 1 / speed  # target steps saved per token left
    assert auto.catch_up_pays(2, 50, 1)  # the target's own token after a check: 6 ms
    assert not auto.catch_up_pays(700, 128, 1)  # a 700-token prompt (2.1 s) for 128 tokens
    assert auto.catch_up_pays(700, int(60 / saving), 1)  # ... pays where enough are left

    spec = Speculative(k="auto", lookup=True)
    spec.auto.use_profiles(draft, target)
    spec.use_in_flight(lambda: 2)
    prompt = list(range(700))  # no repeats: nothing to look up
    states = [{}, {"draft_holds": True}, {}]  # never on the draft model; drafted before; never
    result = StepResult(
        model="large",
        model_index=1,
        request_ids=["a", "b", "c"],
        tokens=torch.zeros(3, dtype=torch.long),
        logits=torch.zeros(3, 8),
        num_generated=torch.tensor([0, 0, 0]),
        states=states,
        params=[SamplingParams(temperature=0, max_tokens=m) for m in (128, 128, 20_000)],
        seeds=[0, 0, 0],
        history=[prompt, prompt, prompt],
    )
    assert spec.route(result).next_model.tolist() == [1, 0, 0]  # a stays on the target: 128 left
    draft_step = StepResult(
        model="small",
        model_index=0,
        request_ids=["a"],
        tokens=torch.zeros(1, dtype=torch.long),
        logits=torch.zeros(1, 8),
        num_generated=torch.tensor([1]),
        states=[states[0]],
        params=[SamplingParams(temperature=0, max_tokens=128)],
        seeds=[0],
        tentative=torch.tensor([1]),
        history=[prompt + [1]],
    )
    spec.route(draft_step)
    assert states[0]["draft_holds"]  # once it has stepped on a request, the draft model drafts as planned
    assert spec.route(result).next_model.tolist() == [0, 0, 0]


def test_auto_drafts_on_while_the_draft_is_sure_and_stops_at_its_first_doubt():
    """k="auto" on a draft step: a row goes on drafting while its chain (the draft's probability
    that every token it drafted this cycle is accepted) times the acceptance rate pays for one
    more draft step and check token at the planned speed; an unsure draft, a chain worn down by
    several fair ones, or max_k ends it. Back from the target, the chain starts again."""
    from tokenrouter.policies import PeerMessage, StepResult

    spec = Speculative(k="auto", max_k=6)
    spec.auto.use_profiles(lambda b: 0.012, lambda n: 0.036 * max(1.0, n / 16))  # a third; checks free
    spec.use_in_flight(lambda: 1)

    def draft_step(sure: float, tentative: int, state: dict) -> int:
        logits = torch.full((1, 8), (1 - sure) / 7).log()
        logits[0, 3] = torch.tensor(sure).log()  # the argmax, with probability `sure`
        result = StepResult(
            model="small",
            model_index=0,
            request_ids=["r"],
            tokens=torch.tensor([3]),
            logits=logits,
            num_generated=torch.tensor([tentative]),
            states=[state],
            params=[SamplingParams(temperature=0)],
            seeds=[0],
            tentative=torch.tensor([tentative]),
        )
        return spec.route(result).next_model.tolist()[0]

    state: dict = {}
    assert [draft_step(0.99, t, state) for t in (1, 2, 3, 4, 5)] == [0, 0, 0, 0, 0]  # sure: on
    assert draft_step(0.99, 6, state) == 1  # max_k
    spec.receive(PeerMessage("r", "large", "small", start=0, tokens=[], confirmed=0), state)
    assert "draft_chain" not in state  # a new cycle
    assert draft_step(0.99, 1, state) == 0 and draft_step(0.2, 2, state) == 1  # the first doubt ends it
    state, t = {}, 1
    while draft_step(0.8, t, state) == 0:  # fair drafts: on for a while, then the chain is too weak
        t += 1
    assert 2 <= t < 6 and state["draft_chain"] == pytest.approx(0.8**t, rel=1e-3)
    # where the check's extra token costs a whole target step, even a sure draft stops at once
    spec.auto.use_profiles(lambda b: 0.012, lambda n: 0.036, lambda b, t: 0.036 * t)
    assert draft_step(0.99, 1, {}) == 1


def test_auto_learns_the_acceptance_rate_per_judged_draft():
    """The cycle formula's a is the chance that a judged draft is accepted; drafts after the
    first rejection are never judged. Cycles of 4 drafts alternating "all 4 accepted" and "the
    first accepted, the second rejected" judge 6 drafts for 5 accepted: a = 5/6, not 5/8."""
    from tokenrouter.policies import VerifyResult

    spec = Speculative(k="auto")
    drafts = torch.tensor([[5, 6, 7, 8]])

    def cycle(accepted: int):
        logits = torch.zeros(1, 5, 16)
        for j in range(4):
            logits[0, j, int(drafts[0, j]) if j < accepted else 0] = 1.0  # the target's argmax
        result = VerifyResult(
            model="large",
            model_index=1,
            request_ids=["r"],
            sources=["small"],
            start=torch.tensor([3]),
            num_drafts=torch.tensor([4]),
            drafts=drafts,
            logits=logits,
            num_generated=torch.tensor([0]),
            states=[{}],
            params=[SamplingParams(temperature=0)],
            seeds=[0],
        )
        assert int(spec.verify(result).accept[0]) == accepted

    for _ in range(200):
        cycle(4)
        cycle(1)
    assert abs(spec.auto.rate - 5 / 6) < 0.02, spec.auto.rate


def test_auto_draft_length_plans_for_every_request_in_the_engine():
    """k="auto" plans for the requests in flight in the engine (use_in_flight), not for the rows
    of the step at hand: a target step of 2 rows while 16 requests are in flight drafts nothing
    when verifying 16 is compute-bound, and drafts when only those 2 are in flight."""
    import torch

    from tokenrouter.policies import StepResult

    def target_step(policy, rows):
        result = StepResult(
            model="large",
            model_index=1,
            request_ids=[str(i) for i in range(rows)],
            tokens=torch.zeros(rows, dtype=torch.long),
            logits=torch.zeros(rows, 8),
            num_generated=torch.ones(rows, dtype=torch.long),
            states=[{} for _ in range(rows)],
        )
        return policy.route(result).next_model.tolist()

    in_flight = {"n": 16}
    spec = Speculative(k="auto")
    spec.auto.use_profiles(
        lambda b: 0.08 * (1 + b / 64), lambda n: 0.29 * max(1.0, n / 16)
    )  # memory-bound up to 16 tokens
    spec.use_in_flight(lambda: in_flight["n"])
    assert target_step(spec, 2) == [1, 1] and spec.auto.best(16) == 0  # 16 in flight: the target writes on alone
    in_flight["n"] = 2
    assert target_step(spec, 2) == [0, 0] and spec.auto.best(2) >= 3  # 2 in flight: cheap drafts again


def test_the_drafter_hands_its_whole_step_to_the_target_once_a_row_is_due():
    """Rows out of phase (one at its k-th draft, others at their first) go to the target together,
    so that its check covers every request at once; none goes while none is due."""
    from tokenrouter.policies import StepResult

    def draft_step(tentative):
        rows = len(tentative)
        result = StepResult(
            model="small",
            model_index=0,
            request_ids=[str(i) for i in range(rows)],
            tokens=torch.zeros(rows, dtype=torch.long),
            logits=torch.zeros(rows, 8),
            num_generated=torch.ones(rows, dtype=torch.long),
            states=[{} for _ in range(rows)],
            params=[SamplingParams(temperature=0)] * rows,
            seeds=[0] * rows,
            tentative=torch.tensor(tentative),
        )
        return Speculative(k=3).route(result).next_model.tolist()

    assert draft_step([1, 2, 2]) == [0, 0, 0]
    assert draft_step([3, 1, 2]) == [1, 1, 1]
    assert draft_step([2]) == [0] and draft_step([3]) == [1]


def test_auto_starts_a_request_on_the_target_when_it_plans_no_drafts():
    """k="auto" starts a request on the draft model only when drafting pays at the load now; at a
    load where the verifier is compute-bound the target takes the prompt in itself. Asking has
    no side effect: the acceptance estimate does not drift."""
    spec = Speculative(k="auto")
    spec.auto.use_profiles(
        lambda b: 0.08 * (1 + b / 64), lambda n: 0.29 * max(1.0, n / 16)
    )  # memory-bound up to 16 tokens
    in_flight = {"n": 1}
    spec.use_in_flight(lambda: in_flight["n"])
    assert spec.start_model() == "small"
    in_flight["n"] = 64
    rate = spec.auto.rate
    assert spec.start_model() == "large" and spec.auto.rate == rate
    assert Speculative(k=4).start_model() == "small"  # a fixed k always drafts


class _NeverDrafts(Speculative):
    """k="auto" with measured costs replaced by ones under which no draft ever pays."""

    def use_profiles(self, profiles: dict) -> None:
        self.auto.use_profiles(lambda b: 10.0, lambda n: 1.0)


def test_requests_planned_without_drafts_never_visit_the_draft_model(tiny_pair, tokenizer, monkeypatch, tmp_path):
    """Served: with no draft worth writing, the draft model takes in no prompt and writes nothing,
    and the answers are the large model's (Hugging Face generate)."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))  # k="auto" profiles the models: cache them here
    work = _workload(tokenizer, n=6)
    outs, stats = _serve(_specs(tiny_pair), _NeverDrafts(k="auto"), work)
    for (prompt, n), out in zip(work, outs):
        assert out.token_ids == hf_greedy(tiny_pair["large"], prompt, n)
        assert set(out.token_models) == {"large"} and out.num_handoffs == 0
    assert stats["small"].tokens_processed == 0 and stats["small"].handoffs_received == 0


def test_a_policy_bound_to_an_engine_still_travels_to_an_actor():
    """The in-flight count is a closure over one engine (locks and all); a copy (as Ray sends a
    policy to an actor) leaves it behind, so a policy an in-process engine used can be placed."""
    import pickle
    import threading

    engine_state = {"requests": {"a": 1}, "lock": threading.Lock()}  # what an engine's closure holds
    spec = Speculative(k=3)
    spec.use_in_flight(lambda: len(engine_state["requests"]))
    assert spec.in_flight("large", 1) == 1
    copy = pickle.loads(pickle.dumps(spec))
    assert copy.engine_in_flight is None and copy.k == 3 and spec.engine_in_flight is not None
    assert copy.in_flight("large", 2) == 2  # unbound: the latest steps stand in


PENALTY_KINDS = [
    {"repetition_penalty": 1.5},
    {"presence_penalty": 0.6, "frequency_penalty": 0.4},
    {"repetition_penalty": 1.3, "presence_penalty": -0.5, "frequency_penalty": 0.7},
]


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculative_with_penalties_is_the_penalized_large_model(drafting_pair, tokenizer, k):
    """Penalties under a verifying policy: the verifier's rows of a check are penalized with the
    tokens before each position, so greedy Speculative gives Hugging Face generate's tokens on
    the large model with the same penalties. Each token's logprob is its writer's (an accepted
    draft the small model's, a correction the large one's), equal to that model's own penalized
    log-softmax there; rolled-back drafts' records are gone with them."""
    work = _workload(tokenizer, n=12, seed=17)
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2, **PENALTY_KINDS[i % 3])
        for i, (_, n) in enumerate(work)
    ]

    async def main():
        async with Engine(models=_specs(drafting_pair), policy=Speculative(k=k)) as e:
            outs = await generate_all(e, [p for p, _ in work], params)
            await wait_all_free(e)
            assert holds_nothing(e)
            return outs

    outs = anyio.run(main)
    for (prompt, n), sp, out in zip(work, params, outs):
        assert out.token_ids == hf_greedy_penalized(drafting_pair["large"], prompt, n, sp), (prompt, sp)
        assert [r.model for r in out.logprobs] == out.token_models
        ids = prompt + out.token_ids
        rows = {
            m: torch.log_softmax(penalized_logits(drafting_pair[m], ids, len(prompt), sp), -1) for m in drafting_pair
        }
        for i, (record, token, model) in enumerate(zip(out.logprobs, out.token_ids, out.token_models)):
            assert record.token_id == token
            assert abs(record.logprob - float(rows[model][i, token])) < 1e-9, (prompt, i, model)
            assert [t for t, _ in record.top] == rows[model][i].topk(2).indices.tolist()
    written = [m for o in outs for m in o.token_models]
    assert "small" in written and "large" in written
    plain = [hf_greedy(drafting_pair["large"], p, n) for p, n in work]
    assert plain != [o.token_ids for o in outs]  # the penalties mattered


class _Spy(Speculative):
    """Speculative that keeps what every `verify` was shown."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    def verify(self, result):
        for i, rid in enumerate(result.request_ids):
            n = int(result.num_drafts[i])
            self.seen.append(
                (rid, int(result.start[i]), result.drafts[i, :n].tolist(), result.logits[i, : n + 1].clone())
            )
        return super().verify(result)


def test_sampled_speculative_verifies_against_the_penalized_target(drafting_pair, tokenizer):
    """Sampled, with penalties: every check's distributions, those speculative sampling accepts
    and redraws from, are the large model's own penalized logits at each position, counting the
    confirmed tokens and the drafts before it (so the output is distributed as the penalized
    target's). Each token's logprob is its writer's sampled distribution there: for a correction
    the target's p, also where it was redrawn from max(0, p - q)."""
    work = _workload(tokenizer, n=8, seed=19)
    params = [
        SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True, seed=i, logprobs=1, **PENALTY_KINDS[i % 3])
        for i, (_, n) in enumerate(work)
    ]
    spy = _Spy(k=3)

    async def main():
        async with Engine(models=_specs(drafting_pair), policy=spy) as e:
            outs = []
            for i, ((prompt, _), sp) in enumerate(zip(work, params)):
                outs.append(await e.generate(prompt, sp, request_id=f"r{i}"))
            await wait_all_free(e)
            return outs

    outs = anyio.run(main)
    assert len(spy.seen) > len(work)
    rejected = 0
    for rid, start, drafts, logits in spy.seen:
        i = int(rid[1:])
        (prompt, _), sp, out = work[i], params[i], outs[i]
        confirmed = (prompt + out.token_ids)[:start]
        expected = penalized_logits(drafting_pair["large"], confirmed + drafts, len(prompt), sp)[start - len(prompt) :]
        assert expected.shape == logits.shape
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-9)
        final = (prompt + out.token_ids)[start : start + len(drafts)]  # shorter if the request ended in them
        rejected += final != drafts[: len(final)]
    assert rejected > 0  # some checks rolled drafts back
    for (prompt, _), sp, out in zip(work, params, outs):
        ids = prompt + out.token_ids
        rows = {
            m: torch.log_softmax(penalized_logits(drafting_pair[m], ids, len(prompt), sp), -1) for m in drafting_pair
        }
        for i, (record, token, model) in enumerate(zip(out.logprobs, out.token_ids, out.token_models)):
            assert (record.token_id, record.model) == (token, model)
            assert abs(record.logprob - float(rows[model][i, token])) < 1e-9
