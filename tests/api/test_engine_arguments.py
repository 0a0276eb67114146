"""Bad arguments to Engine(), table-driven: models, policies naming models the engine lacks,
tokenizers that differ, and every option at and beyond its limits; nothing starts (tests/bad_input.py)."""

from __future__ import annotations

import inspect
import threading
import time

import anyio
import anyio.from_thread
import pytest
import torch

from tests.bad_input import INF, NAN, NO_SUCH_PATH, show
from tokenrouter import (
    ConfigError,
    Engine,
    EngineNotRunningError,
    ModelLoadError,
    ModelSpec,
    Policy,
    RayPlacement,
    RStitch,
    Single,
    TokenRouterError,
)
from tokenrouter.config import EngineOptions
from tokenrouter.testing import build_tiny_model, build_tokenizer, workers_of


# ---- Engine() ----------------------------------------------------------------------------------
class _NeedsHiddenStates(Policy):
    requires = frozenset({"hidden_states"})

    @property
    def models(self):
        return ["a"]


M = object()  # stands for the tiny model's directory in the rows below
ONE = {"a": M}
PLACED = object()  # the tiny model, placed in a Ray actor
ONE_PLACED = {"a": PLACED}


def _fill(x, path):
    """A copy of a row's kwargs with M replaced by `path` (PLACED by a ModelSpec of it with a placement)."""
    if x is M:
        return path
    if x is PLACED:
        return ModelSpec(path=path, placement=RayPlacement())
    if isinstance(x, dict):
        return {k: _fill(v, path) for k, v in x.items()}
    if isinstance(x, list):
        return [_fill(v, path) for v in x]
    return x


def _bad_values(param, values):
    return [(f"{param}={show(v)}", {"models": ONE, param: v}, ConfigError, param, frag) for v, frag in values]


# (id, kwargs, error type, the parameter the message starts with, fragment of the message)
ENGINE_REJECTED = [
    # models
    ("models-list", {"models": [M]}, ConfigError, "models", "must be a dict"),
    ("models-str", {"models": NO_SUCH_PATH}, ConfigError, "models", "must be a dict"),
    ("models-int", {"models": 5}, ConfigError, "models", "must be a dict"),
    ("models-empty-dict", {"models": {}}, ConfigError, "models", "at least one model"),
    ("models-int-name", {"models": {1: M}}, ConfigError, "models", "non-empty strings"),
    ("models-empty-name", {"models": {"": M}}, ConfigError, "models", "non-empty strings"),
    ("models-none-name", {"models": {None: M}}, ConfigError, "models", "non-empty strings"),
    ("model-int", {"models": {"a": 5}}, ConfigError, "models['a']", "path or a ModelSpec"),
    ("model-none", {"models": {"a": None}}, ConfigError, "models['a']", "path or a ModelSpec"),
    ("model-dict", {"models": {"a": {"path": M}}}, ConfigError, "models['a']", "path or a ModelSpec"),
    ("model-missing", {"models": {"a": NO_SUCH_PATH}}, ConfigError, "models['a']", "does not exist"),
    ("model-empty-path", {"models": {"a": ""}}, ConfigError, "models['a']", "is empty"),
    # no models: the demo pair from the store (an empty one here)
    ("default-policy-str", {"policy": "rstitch"}, ConfigError, "policy", "must be a Policy"),
    ("default-policy-unknown", {"policy": Single("m")}, ConfigError, "models", "policy names ['m']"),
    ("default-not-pulled", {}, ModelLoadError, "models", "tokenrouter pull demo"),
    # policy
    ("policy-str", {"models": ONE, "policy": "single"}, ConfigError, "policy", "must be a Policy"),
    ("policy-class", {"models": ONE, "policy": Single}, ConfigError, "policy", "must be a Policy"),
    ("policy-missing", {"models": {"a": M, "b": M}}, ConfigError, "policy", "need a routing policy"),
    ("policy-unknown-model", {"models": ONE, "policy": Single("b")}, ConfigError, "policy", "['b'] that are not"),
    (
        "policy-half-unknown",
        {"models": {"small": M, "big": M}, "policy": RStitch(small="small", large="large")},
        ConfigError,
        "policy",
        "['large'] that are not in models ['big', 'small']",
    ),
    ("policy-requires", {"models": ONE, "policy": _NeedsHiddenStates()}, ConfigError, "policy", "hidden_states"),
    *_bad_values(
        "num_threads",
        [(0, "greater than or equal to 1"), (-1, "greater than or equal to 1")]
        + [(v, "valid integer") for v in (1.5, 2.0, "2", True, False, [2])],
    ),
    *_bad_values(
        "delayed_batching",
        [(v, ">= 1") for v in (0, -2, True, 1.5, "2", [2], {"a": 0}, {"a": True}, {"a": 2.0})]
        + [({"zzz": 2}, "unknown model(s) ['zzz']"), ({1: 2, "x": 3}, "unknown model(s) ['x', 1]")],
    ),
    *_bad_values(
        "batch_wait_s",
        [(-0.01, "greater than or equal to 0")]
        + [(v, "finite number") for v in (NAN, INF, -INF)]
        + [(v, "valid number") for v in ("0.1", None, True, [0.1])],
    ),
    *_bad_values(
        "stop_timeout",
        [(v, "greater than") for v in (0, 0.0, -1)]
        + [(v, "finite number") for v in (NAN, INF, -INF)]
        + [(v, "valid number") for v in ("30", None, True, [30])],
    ),
    *_bad_values(
        "mode", [(v, "should be 'routed', 'standard' or 'lockstep'") for v in ("fast", "", "ROUTED", None, 0)]
    ),
    *_bad_values("deterministic", [(v, "valid boolean") for v in (1, "yes", None)]),
    *_bad_values(
        "auto_batching", [(v, "valid dictionary or instance of AutoBatchingOptions") for v in (1, "fast", [1.0])]
    ),
    *_bad_values("ray_address", [(v, "valid string") for v in (5, True, b"local", ["local"])]),
    *_bad_values("ray_address", [(v, "must be 'local', 'auto', 'host:port'") for v in ("", "  ", "local host", "a\n")]),
    (
        "ray_address-nothing-placed",
        {"models": ONE, "ray_address": "local"},
        ConfigError,
        "ray_address",
        "no model has a placement",
    ),
    *_bad_values(
        "placement_strategy",
        [(v, "should be 'PACK', 'SPREAD', 'STRICT_PACK' or 'STRICT_SPREAD'") for v in ("pack", "", "SPREAD ", 1, True)],
    ),
    (
        "placement_strategy-nothing-placed",
        {"models": ONE, "placement_strategy": "PACK"},
        ConfigError,
        "placement_strategy",
        "no model has a placement",
    ),
    (
        "mode-lockstep-placed",
        {"models": ONE_PLACED, "mode": "lockstep"},
        ConfigError,
        "mode",
        "no model can be placed in a Ray actor",
    ),
    *_bad_values(
        "auto_batching",
        [
            ({"interval_s": 0}, "greater than 0"),
            ({"interval_s": "1"}, "valid number"),
            ({"shared_device": 2.0}, "less than or equal to 1"),
            ({"latency_bound_s": -1.0}, "greater than 0"),
            ({"typo": 1.0}, "Extra inputs"),
        ],
    ),
]

ENGINE_ACCEPTED = [
    ("one-model-path", {"models": ONE}),
    ("one-model-str", {"models": {"a": "str"}}),
    ("one-model-spec", {"models": {"a": "spec"}}),
    ("policy-single", {"models": {"a": M, "b": M}, "policy": Single("b")}),
    ("policy-rstitch", {"models": {"x": M, "y": M}, "policy": RStitch(small="y", large="x")}),
    ("num_threads=1", {"models": ONE, "num_threads": 1}),
    ("num_threads=None", {"models": ONE, "num_threads": None}),
    ("delayed_batching=1", {"models": ONE, "delayed_batching": 1}),
    ("delayed_batching={}", {"models": ONE, "delayed_batching": {}}),
    ("delayed_batching={a:4}", {"models": ONE, "delayed_batching": {"a": 4}}),
    ("batch_wait_s=0", {"models": ONE, "batch_wait_s": 0}),
    ("batch_wait_s=1e9", {"models": ONE, "batch_wait_s": 1e9}),
    ("stop_timeout=1e-3", {"models": ONE, "stop_timeout": 1e-3}),
    ("stop_timeout=1", {"models": ONE, "stop_timeout": 1}),
    *[(f"deterministic={v}", {"models": ONE, "deterministic": v}) for v in (True, False)],
    *[(f"mode={v}", {"models": ONE, "mode": v}) for v in ("routed", "standard", "lockstep")],
    ("auto_batching=None", {"models": ONE, "auto_batching": None}),
    ("auto_batching=dict", {"models": ONE, "delayed_batching": "auto", "auto_batching": {"interval_s": 0.5}}),
    ("placed", {"models": ONE_PLACED}),
    ("placed-standard", {"models": ONE_PLACED, "mode": "standard"}),
    *[
        (f"ray_address={v}", {"models": ONE_PLACED, "ray_address": v})
        for v in (None, "local", "auto", "10.0.0.1:6379", "ray://head:10001")
    ],
    *[
        (f"placement_strategy={v}", {"models": ONE_PLACED, "placement_strategy": v})
        for v in (None, "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
    ],
]


def _worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tokenrouter-worker-")}


def test_engine_tables_cover_every_parameter():
    params = set(inspect.signature(Engine.__init__).parameters) - {"self", "options"}
    params |= set(EngineOptions.model_fields)  # the keyword options
    assert set().union(*(kwargs for _, kwargs, *_ in ENGINE_REJECTED)) == params  # each is given badly
    assert {param.split("[")[0] for *_, param, _ in ENGINE_REJECTED} == params  # and named by the error


@pytest.mark.parametrize("kwargs, error, param, fragment", [pytest.param(*r[1:], id=r[0]) for r in ENGINE_REJECTED])
def test_engine_constructor_rejects_bad_arguments(monkeypatch, tmp_path, tiny_model, kwargs, error, param, fragment):
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))  # an empty store, for the rows without models
    before = _worker_threads()
    with pytest.raises(TokenRouterError) as e:
        Engine(**_fill(kwargs, tiny_model))
    assert type(e.value) is error, f"{type(e.value).__name__}: {e.value}"
    assert isinstance(e.value, ValueError)
    message = str(e.value)
    assert message.startswith(param), message
    assert fragment in message, message
    assert _worker_threads() == before  # nothing was started


@pytest.mark.parametrize("kwargs", [pytest.param(r[1], id=r[0]) for r in ENGINE_ACCEPTED])
def test_engine_constructor_accepts_values_at_the_limits(tiny_model, kwargs):
    kwargs = _fill(kwargs, tiny_model)
    kwargs["models"] = {
        n: str(tiny_model) if v == "str" else ModelSpec(path=tiny_model) if v == "spec" else v
        for n, v in kwargs["models"].items()
    }
    engine = Engine(**kwargs)
    models = engine.info().models
    assert set(models) == set(kwargs["models"])
    assert all(model.spec.path == tiny_model and not model.loaded for model in models.values())
    assert not workers_of(engine)  # constructing starts nothing


def test_tokenizers_that_differ_are_rejected_at_start_with_both_names(tmp_path, tiny_model):
    alien = build_tiny_model(
        tmp_path / "alien", "qwen2", dtype=torch.float64, tokenizer=build_tokenizer(vocab_size=300)
    )
    engine = Engine(models={"native": tiny_model, "alien": alien}, policy=RStitch(small="native", large="alien"))

    async def main():
        with pytest.raises(ConfigError) as e:
            await engine.start()
        message = str(e.value)
        assert "different tokenizers" in message
        assert "'native'" in message and "'alien'" in message
        assert str(tiny_model) in message and str(alien) in message
        # nothing is left running, and the engine takes no requests
        assert not workers_of(engine) and not any(m.loaded for m in engine.info().models.values())
        with pytest.raises(EngineNotRunningError):
            await engine.generate([1, 2, 3])

    anyio.run(main)
    deadline = time.monotonic() + 10
    while any(t.name.endswith(("-native", "-alien")) for t in _worker_threads()):
        assert time.monotonic() < deadline, "the workers of a rejected engine did not stop"
        time.sleep(0.01)
