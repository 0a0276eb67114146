"""Bad input gets a clear error naming the field; loading covers dtypes, architectures and errors."""

import math

import anyio
import pydantic
import pytest
import torch

from tokenrouter import (
    ConfigError,
    Engine,
    EngineNotRunningError,
    InvalidRequestError,
    ModelLoadError,
    ModelSpec,
    SamplingParams,
    Single,
)
from tokenrouter.testing import build_tiny_model, workers_of


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, field):
    with pytest.raises(pydantic.ValidationError) as e:
        SamplingParams(**kwargs)
    assert field in str(e.value)


def test_sampling_params_limits_are_accepted():
    SamplingParams(max_tokens=1, temperature=0, top_p=1.0, top_k=0, min_p=0.0, seed=0)
    SamplingParams(top_p=1e-9, min_p=1.0, stop="one string")


def test_model_spec_rejects_bad_values(tmp_path):
    with pytest.raises(pydantic.ValidationError, match="path"):
        ModelSpec(path=tmp_path / "missing")
    with pytest.raises(pydantic.ValidationError, match="dtype"):
        ModelSpec(path=tmp_path, dtype="int8")
    with pytest.raises(pydantic.ValidationError, match="device"):
        ModelSpec(path=tmp_path, device="quantum:0")
    with pytest.raises(pydantic.ValidationError, match="not both"):
        ModelSpec(path=tmp_path, kv_cache_tokens=10, kv_cache_bytes=10)
    with pytest.raises(pydantic.ValidationError, match="block_size"):
        ModelSpec(path=tmp_path, block_size=0)


def test_engine_constructor_errors(tiny_model):
    with pytest.raises(ConfigError, match="models"):
        Engine(models={})
    with pytest.raises(ConfigError, match="not in models"):
        Engine(models={"a": tiny_model}, policy=Single("b"))
    with pytest.raises(ConfigError, match="policy"):
        Engine(models={"a": tiny_model, "b": tiny_model})
    with pytest.raises(ConfigError, match=r"models\['a'\]"):
        Engine(models={"a": "/no/such/dir"})
    with pytest.raises(ConfigError, match="num_threads"):
        Engine(models={"a": tiny_model}, num_threads=0)


def test_missing_or_broken_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")

    async def main():
        async with Engine(models={"m": tmp_path}):
            pass

    with pytest.raises(ModelLoadError, match="no weights"):
        anyio.run(main)
    empty = tmp_path / "empty"
    empty.mkdir()

    async def main2():
        async with Engine(models={"m": empty}):
            pass

    with pytest.raises(ModelLoadError, match="not a model directory"):
        anyio.run(main2)


def test_bad_requests_fail_clearly_and_others_go_on(tiny_model, tokenizer):
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=2048, max_model_len=64)
    good = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    cases = [
        ("", "prompt", "empty"),
        ([], "prompt", "empty"),
        ([1] * 64, "prompt", "64 tokens"),
        ("x " * 200, "prompt", "context holds 64"),
        ([1, len(tokenizer) + 5], "prompt", "outside the vocabulary"),
        ([1, -1], "prompt", "outside the vocabulary"),
        ("bad \ud800 surrogate", "prompt", "lone surrogate"),
        (b"bytes", "prompt", "bytes"),
        ([{"role": "wizard", "content": "hi"}], "prompt[0].role", "unknown role"),
        ([{"role": "user", "content": 3}], "prompt[0].content", "string"),
        ([1, "a"], "prompt", "all token ids"),
        (42, "prompt", "int"),
    ]

    async def main():
        async with Engine(models={"m": spec}) as engine:
            for prompt, field, words in cases:
                with pytest.raises(InvalidRequestError, match=words) as e:
                    await engine.generate(prompt, good)
                assert e.value.field == field
            with pytest.raises(InvalidRequestError, match="stop_token_ids"):
                await engine.generate([1], SamplingParams(stop_token_ids=[10**6]))
            with pytest.raises(InvalidRequestError, match="params"):
                await engine.generate([1], {"max_tokens": 3})
            # max_tokens beyond the context is capped: it ends with 'length' at the limit
            out = await engine.generate([1] * 60, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
            assert out.finish_reason == "length" and len(out.token_ids) == 4
            assert (await engine.generate([1, 2, 3], good)).finish_reason == "length"

    anyio.run(main)


def test_not_running_errors(tiny_model):
    engine = Engine(models={"m": tiny_model})

    async def main():
        with pytest.raises(EngineNotRunningError):
            await engine.generate([1, 2], SamplingParams())

    anyio.run(main)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16", "auto"])
def test_dtypes(tmp_path, tokenizer, dtype):
    path = build_tiny_model(tmp_path / "m", "llama", dtype=torch.float32, tokenizer=tokenizer)

    async def main():
        async with Engine(models={"m": ModelSpec(path=path, dtype=dtype, kv_cache_tokens=256)}) as engine:
            want = torch.float32 if dtype == "auto" else getattr(torch, dtype)
            assert engine.info().models["m"].dtype == want
            assert workers_of(engine)["m"].core.cache.k[0].dtype == want
            out = await engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            assert len(out.token_ids) == 4

    anyio.run(main)


def test_encoder_decoder_is_rejected(tmp_path):
    from transformers import T5Config

    T5Config(num_layers=1, d_model=8, d_ff=8, num_heads=1, d_kv=8).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")

    async def main():
        async with Engine(models={"m": tmp_path}):
            pass

    with pytest.raises(ModelLoadError, match="encoder-decoder"):
        anyio.run(main)


@pytest.mark.parametrize(
    "arch, overrides, reason",
    [
        ("gemma2", {"head_dim": 16, "attn_logit_softcapping": 50.0}, "caps its attention logits"),
        ("gpt_oss", {"head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1}, "learned attention sinks"),
    ],
)
def test_attention_the_paged_backends_do_not_compute_fails_at_load(tmp_path, tokenizer, arch, overrides, reason):
    """README's exceptions to "any decoder-only model": refused when the engine starts, with why."""
    path = build_tiny_model(tmp_path / arch, arch, tokenizer=tokenizer, **overrides)

    async def main():
        async with Engine(models={"m": path}):
            pass

    with pytest.raises(ModelLoadError, match=reason):
        anyio.run(main)


# ---- defaults and store names ------------------------------------------------------------------
def test_engine_without_models_names_the_pull_command(monkeypatch, tmp_path):
    from tokenrouter import Engine, ModelLoadError
    from tokenrouter.policies import RStitch

    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    for make in (lambda: Engine(), lambda: Engine(policy=RStitch(tau=0.03))):
        with pytest.raises(ModelLoadError, match="fetch it with `tokenrouter pull demo`"):
            make()


def test_engine_without_models_needs_a_policy_naming_the_demo_roles(monkeypatch, tmp_path):
    from tokenrouter import ConfigError, Engine, Single

    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"only provides \['large', 'small'\], while the policy names \['m'\]"):
        Engine(policy=Single("m"))


def _fake_store_model(home, name, real_dir):
    """Put a model into a store at `home` under a registered name (a copy of a tiny model)."""
    import shutil

    from tokenrouter import store

    target = store.model_dir(name, home)
    shutil.copytree(real_dir, target)
    (target / store.COMPLETE_MARKER).write_text("test\n")
    return target


def test_store_names_work_wherever_a_model_is_named(monkeypatch, tmp_path, tiny_model):
    from pydantic import ValidationError

    from tokenrouter import Engine, ModelSpec, RStitch

    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    with pytest.raises(ValidationError, match="fetch it with `tokenrouter pull smollm2`"):
        ModelSpec(path="smollm2")
    target = _fake_store_model(tmp_path, "smollm2", tiny_model)
    assert ModelSpec(path="smollm2").path == target
    assert Engine(models={"m": "smollm2"}).info().models["m"].spec.path == target
    _fake_store_model(tmp_path, "qwen-coder-0.5b", tiny_model)
    _fake_store_model(tmp_path, "qwen-coder-1.5b", tiny_model)
    engine = Engine()
    info = engine.info()
    assert isinstance(info.policy, RStitch) and info.policy.tau == 0.03
    assert {m: model.spec.path.name for m, model in info.models.items()} == {
        "small": "qwen-coder-0.5b",
        "large": "qwen-coder-1.5b",
    }
