"""CITER, R2R, CoLLM and Escalation: engine output and per-token attribution equal the reference
implementation under concurrency; routers round-trip through disk; bad routers fail at
construction or at engine start, never mid-request."""

from __future__ import annotations

import json
import random

import anyio
import pytest
import torch

from tests.conftest import TINY_PAIR_TAU
from tests.helpers import generate_all, wait_all_free
from tokenrouter import ConfigError, Engine, ModelSpec, SamplingParams
from tokenrouter.engine import HiddenCapture
from tokenrouter.policies import CITER, R2R, CoLLM, Escalation
from tokenrouter.policies.routers import (
    RouterConfig,
    RouterNet,
    load_router,
    model_identity,
    router_features,
    save_router,
)
from tokenrouter.testing import (
    build_tiny_model,
    captures_hidden_states,
    load_reference_models,
    reference_generate,
    workers_of,
)

POLICIES = {"citer": CITER, "r2r": R2R, "collm": CoLLM}
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 380) for _ in range(rng.randint(3, 20))] for _ in range(n)]


@pytest.fixture(scope="module")
def ref_models(tiny_pair):
    return load_reference_models(tiny_pair, torch.float64)


def make_router(kind: str, ref_models, seed: int = 0) -> RouterNet:
    """A random router for the tiny pair, its threshold at the median of its outputs, so that
    about half the small model's tokens are deferred."""
    small, large = ref_models["small"], ref_models["large"]
    torch.manual_seed(seed)
    config = RouterConfig(
        kind=kind,
        hidden_size=small.config.hidden_size,
        width=32,
        threshold=0.5,
        small=model_identity(small),
        large=model_identity(large),
    )
    net = RouterNet(config).double().eval()
    capture = HiddenCapture(small)
    try:
        with torch.no_grad():
            ids = torch.tensor([sum(_prompts(4, 99), [])])
            logits = small(ids).logits[0]
            hidden = capture.take()[0]
    finally:
        capture.remove()
    emb = small.get_input_embeddings()(logits.argmax(-1))
    p = net.probability(router_features(kind, hidden, emb, logits, config.top_k))
    net.config.threshold = float(p.median())
    return net


async def _serve(policy, specs, prompts):
    async with Engine(models=specs, policy=policy, num_threads=1) as engine:
        outs = await generate_all(engine, prompts, PARAMS)
        await wait_all_free(engine)
    return dict(enumerate(outs))


def _specs(paths):
    return {n: ModelSpec(path=p, dtype="float64", kv_cache_tokens=2048, block_size=8) for n, p in paths.items()}


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_learned_policy_equals_reference(kind, tiny_pair, ref_models):
    policy = POLICIES[kind](make_router(kind, ref_models))
    prompts = _prompts(8, seed=len(kind))
    outs = anyio.run(_serve, policy, _specs(tiny_pair), prompts)
    moved = 0
    for i, p in enumerate(prompts):
        ref = reference_generate(policy, ref_models, p, PARAMS)
        assert outs[i].token_ids == ref.token_ids, i
        assert outs[i].token_models == ref.token_models, i
        assert outs[i].num_handoffs == ref.num_handoffs, i
        moved += ref.num_handoffs
    assert moved > 8, "the router was meant to defer tokens to the large model"


@pytest.fixture(scope="module")
def trio_models(tmp_path_factory, tokenizer, tiny_pair):
    root = tmp_path_factory.mktemp("trio")
    medium = build_tiny_model(
        root / "medium",
        "qwen2",
        dtype=torch.float64,
        seed=3,
        tokenizer=tokenizer,
        logit_scale=3.0,
        num_hidden_layers=2,
        hidden_size=80,
    )
    return {"small": tiny_pair["small"], "medium": medium, "large": tiny_pair["large"]}


def test_escalation_over_three_models_equals_reference(trio_models):
    policy = Escalation(models=["small", "medium", "large"], taus=[TINY_PAIR_TAU, TINY_PAIR_TAU])
    prompts = _prompts(8, seed=5)
    outs = anyio.run(_serve, policy, _specs(trio_models), prompts)
    models = load_reference_models(trio_models, torch.float64)
    writers = set()
    for i, p in enumerate(prompts):
        ref = reference_generate(policy, models, p, PARAMS)
        assert outs[i].token_ids == ref.token_ids, i
        assert outs[i].token_models == ref.token_models, i
        writers |= set(ref.token_models)
    assert writers == {"small", "medium", "large"}  # escalation reached every level


def test_escalation_rules():
    with pytest.raises(ConfigError, match="two or more distinct names"):
        Escalation(models=["a"], taus=[])
    with pytest.raises(ConfigError, match="one tau per model but the largest"):
        Escalation(models=["a", "b", "c"], taus=[0.1])
    with pytest.raises(ConfigError, match=r"taus\[1\] must be a normalized entropy"):
        Escalation(models=["a", "b", "c"], taus=[0.1, float("nan")])


# ---- saving, loading, and bad routers ------------------------------------------------------------
def test_router_round_trip(tmp_path, ref_models):
    net = make_router("r2r", ref_models)
    save_router(net, tmp_path / "r")
    loaded = load_router(tmp_path / "r", "r2r")
    assert loaded.config == net.config
    x = torch.randn(3, net.config.input_size, dtype=torch.float64)
    torch.testing.assert_close(loaded.double().probability(x), net.probability(x))
    assert R2R(tmp_path / "r").threshold == net.config.threshold  # the trained threshold by default
    assert R2R(tmp_path / "r", threshold=0.7).threshold == 0.7


def test_bad_routers_fail_before_any_request(tmp_path, tiny_pair, ref_models, tokenizer):
    good = tmp_path / "good"
    save_router(make_router("citer", ref_models), good)

    with pytest.raises(ConfigError, match="is not a directory"):
        CITER(tmp_path / "nowhere")
    missing = tmp_path / "missing-config"
    missing.mkdir()
    (missing / "router.safetensors").write_bytes((good / "router.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="router.json is missing"):
        CITER(missing)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "router.json").write_text((good / "router.json").read_text())
    (corrupt / "router.safetensors").write_bytes((good / "router.safetensors").read_bytes()[:100])
    with pytest.raises(ConfigError, match="router.safetensors is corrupt"):
        CITER(corrupt)
    bad_json = tmp_path / "bad-json"
    bad_json.mkdir()
    (bad_json / "router.json").write_text("{not json")
    with pytest.raises(ConfigError, match="router.json is not a valid router file"):
        CITER(bad_json)
    with pytest.raises(ConfigError, match="holds a 'citer' router, not a 'r2r' one"):
        R2R(good)
    with pytest.raises(ConfigError, match="threshold must be a number in"):
        CITER(good, threshold=1.5)

    # Trained for another pair: a model of the same shape with other weights is caught at start.
    other = build_tiny_model(
        tmp_path / "other", "qwen2", dtype=torch.float64, seed=42, tokenizer=tokenizer, logit_scale=3.0
    )
    foreign = {"small": other, "large": tiny_pair["large"]}

    async def start():
        engine = Engine(models=_specs(foreign), policy=CITER(good))
        with pytest.raises(ConfigError, match=r"trained for a small model .* but 'small' has"):
            await engine.start()
        assert not workers_of(engine)  # nothing left running

    anyio.run(start)
    cfg = json.loads((good / "router.json").read_text())
    assert set(cfg) >= {"kind", "hidden_size", "threshold", "small", "large"}


def test_hidden_states_are_captured_only_for_policies_that_ask(tiny_pair, ref_models):
    from tokenrouter.policies import RStitch

    async def runners(policy):
        async with Engine(models=_specs(tiny_pair), policy=policy, num_threads=1) as engine:
            return {name: captures_hidden_states(w) for name, w in workers_of(engine).items()}

    assert anyio.run(runners, RStitch(tau=TINY_PAIR_TAU)) == {"small": False, "large": False}
    assert anyio.run(runners, R2R(make_router("r2r", ref_models))) == {"small": True, "large": True}
