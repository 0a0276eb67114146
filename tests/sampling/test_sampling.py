"""Sampler: filters, reproducible seeds across runs and batch compositions, stop conditions."""

import json
import shutil

import anyio
import torch

from tests.helpers import wait_all_free
from tokenrouter import Engine, ModelSpec, SamplingParams
from tokenrouter.sampling import Sampler, SamplingTensors, uniform_from


def _tensors(n, **kw):
    params = [SamplingParams(**kw)] * n
    return SamplingTensors.build(params, list(range(n)), [0] * n, "cpu")


def test_filters_that_leave_one_token_equal_greedy():
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    greedy = logits.argmax(-1)
    s = Sampler()
    assert torch.equal(s(logits, _tensors(64, temperature=1.0, top_k=1)), greedy)
    assert torch.equal(s(logits, _tensors(64, temperature=1.0, top_p=1e-6)), greedy)
    assert torch.equal(s(logits, _tensors(64, temperature=1.0, min_p=1.0)), greedy)
    assert torch.equal(s(logits, _tensors(64, temperature=0.0)), greedy)


def test_samples_follow_the_distribution_and_respect_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    n = 20000
    st = SamplingTensors.build([SamplingParams(temperature=1.0)] * n, list(range(n)), [3] * n, "cpu")
    freq = torch.bincount(Sampler()(logits.expand(n, 4), st), minlength=4).double() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.double), atol=0.015)
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=2)] * n, list(range(n)), [3] * n, "cpu")
    freq = torch.bincount(Sampler()(logits.expand(n, 4), st), minlength=4).double() / n
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.625) < 0.015
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_p=0.9)] * n, list(range(n)), [3] * n, "cpu")
    freq = torch.bincount(Sampler()(logits.expand(n, 4), st), minlength=4).double() / n
    assert freq[3] == 0 and freq[2] > 0.1  # 0.5 + 0.3 < 0.9, so the third token is still in the nucleus
    st = SamplingTensors.build([SamplingParams(temperature=1.0, min_p=0.2)] * n, list(range(n)), [3] * n, "cpu")
    freq = torch.bincount(Sampler()(logits.expand(n, 4), st), minlength=4).double() / n
    assert freq[3] == 0 and freq[2] > 0.1  # 0.15 >= 0.2 * 0.5 stays, 0.05 goes


def test_uniforms_depend_only_on_seed_and_step():
    seeds = torch.tensor([1, 2, 3, 2**62 + 5])
    steps = torch.tensor([0, 0, 7, 9])
    u = uniform_from(seeds, steps)
    assert ((u > 0) & (u < 1)).all()
    assert torch.equal(u[1:2], uniform_from(seeds[1:2], steps[1:2]))
    assert len(set(uniform_from(torch.full((1000,), 42), torch.arange(1000)).tolist())) == 1000


def test_seeded_sampling_reproducible_across_runs_and_batches(tiny_model, tokenizer):
    prompt = [11, 12, 13, 14]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=2048, block_size=8)

    async def alone():
        async with Engine(models={"m": spec}) as engine:
            return (await engine.generate(prompt, params)).token_ids

    async def crowded():
        async with Engine(models={"m": spec}) as engine:
            res = {}

            async def one(i, p, sp):
                res[i] = (await engine.generate(p, sp)).token_ids

            async with anyio.create_task_group() as tg:
                for i in range(7):
                    tg.start_soon(one, i, [20 + i] * (3 + 5 * i), SamplingParams(temperature=0.8, max_tokens=30))
                tg.start_soon(one, "target", prompt, params)
            await wait_all_free(engine)
            return res["target"]

    first = anyio.run(alone)
    assert anyio.run(alone) == first
    assert anyio.run(crowded) == first
    other = params.model_copy(update={"seed": 99})

    async def other_seed():
        async with Engine(models={"m": spec}) as engine:
            return (await engine.generate(prompt, other)).token_ids

    assert anyio.run(other_seed) != first


def _greedy_run(path, prompt, **kw):
    spec = ModelSpec(path=path, dtype="float64", kv_cache_tokens=2048, block_size=8)

    async def main():
        async with Engine(models={"m": spec}) as engine:
            return await engine.generate(prompt, SamplingParams(temperature=0, **kw))

    return anyio.run(main)


def test_stop_token_ids_and_max_tokens(tiny_model):
    prompt = [30, 31, 32]
    base = _greedy_run(tiny_model, prompt, max_tokens=12, ignore_eos=True)
    assert base.finish_reason == "length" and len(base.token_ids) == 12
    stop_id = base.token_ids[5]
    first = base.token_ids.index(stop_id)
    out = _greedy_run(tiny_model, prompt, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])
    assert out.finish_reason == "stop" and out.token_ids == base.token_ids[: first + 1]


def test_eos_from_generation_config_and_ignore_eos(tiny_model, tmp_path):
    prompt = [40, 41, 42]
    base = _greedy_run(tiny_model, prompt, max_tokens=10, ignore_eos=True)
    eos = base.token_ids[3]
    first = base.token_ids.index(eos)
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model, model_dir)
    gen = json.loads((model_dir / "generation_config.json").read_text())
    gen["eos_token_id"] = [999999, eos]  # a list, as many models ship it
    (model_dir / "generation_config.json").write_text(json.dumps(gen))
    out = _greedy_run(model_dir, prompt, max_tokens=10)
    assert out.finish_reason == "stop" and out.token_ids == base.token_ids[: first + 1]
    out = _greedy_run(model_dir, prompt, max_tokens=10, ignore_eos=True)
    assert out.token_ids == base.token_ids


def test_stop_string_across_token_boundary(tiny_model, tokenizer):
    prompt = tokenizer.encode("The quick brown fox")
    base = _greedy_run(tiny_model, prompt, max_tokens=40, ignore_eos=True)
    # Pick a stop string that starts inside one token's text and ends inside a later one.
    pieces = [tokenizer.decode(base.token_ids[: i + 1]) for i in range(len(base.token_ids))]
    stop = None
    for i in range(3, len(pieces) - 2):
        a, b = len(pieces[i - 1]), len(pieces[i])
        cand = pieces[i + 1][b - 1 : b + 1]  # last char of token i's text, first char of token i+1's
        if (
            b > a
            and len(pieces[i + 1]) > b
            and pieces[i + 1].startswith(pieces[i])
            and "\ufffd" not in cand
            and base.text.find(cand) == b - 1
        ):
            stop = cand
            break
    assert stop is not None, base
    expected = base.text[: base.text.index(stop)]
    out = _greedy_run(tiny_model, prompt, max_tokens=40, ignore_eos=True, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == expected
    out = _greedy_run(tiny_model, prompt, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    assert out.text == expected + stop
