"""Bad input, table-driven: every field and parameter at and beyond its limits, wrong types, NaN
and infinities, invalid Unicode and control characters, token ids outside the vocabulary, chat
messages with unknown roles, tokenizers that differ, policies naming models the engine lacks.

Each case must fail with a typed error that names what was wrong, and none may reach a worker.
The tables also check themselves: every field of SamplingParams and ModelSpec and every
parameter of Engine() has rows, so a new field without bad-input cases fails here.

Decisions these tables pin down:
- numbers and flags are strict: bool is not an int, 3.0 is not an int, "3" is not a number,
  1 is not a bool; an int is a fine float. NaN and +/-inf are rejected wherever a float goes.
- `stop_timeout` is finite and > 0, `batch_wait_s` finite and >= 0, `num_threads` an int >= 1.
- a prompt (or chat content) with NUL is rejected; other control characters (tab, newline,
  ANSI escapes) are text and accepted. A lone surrogate (not encodable as UTF-8) is rejected.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from functools import partial

import anyio
import anyio.from_thread
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
    Policy,
    RayPlacement,
    RStitch,
    SamplingParams,
    Single,
    TokenRouterError,
)
from tokenrouter.config import EngineOptions, Grammar, JsonSchema, Regex
from tokenrouter.testing import build_tiny_model, build_tokenizer

NAN, INF = math.nan, math.inf
NO_SUCH_PATH = "/nonexistent/tokenrouter-test/model"


def _ids(rows, what=lambda r: r):
    return [pytest.param(*r, id=what(r)) for r in rows]


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 24 else s[:21] + "..."


def _check_validation_error(e: pydantic.ValidationError, field: str, fragment: str) -> None:
    """The error is about `field` (its location, or its message for a cross-field rule) and says `fragment`."""
    errors = e.errors()
    located = {err["loc"][0] for err in errors if err["loc"]}
    if located:
        assert located == {field}, f"error located at {located}, expected {field!r}: {e}"
    else:
        assert field in str(e), f"error does not name {field!r}: {e}"
    assert fragment in str(e), f"{fragment!r} not in: {e}"


# ---- SamplingParams ----------------------------------------------------------------------------
SP_INT = ["max_tokens", "top_k", "seed", "n", "logprobs", "prompt_logprobs"]
SP_FLOAT = ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]
SP_BOOL = ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens"]
SP_LIST = ["stop", "stop_token_ids"]
SP_OTHER = ["response_format"]  # dict and model-class shapes: tests/test_structured_output.py

SP_ACCEPTED = [
    ("max_tokens", 1),
    ("max_tokens", 10**9),
    ("temperature", 0),  # an int is a fine float
    ("temperature", 0.0),
    ("temperature", 100.0),
    ("top_k", 0),
    ("top_k", 10**6),
    ("top_p", 1),
    ("top_p", 1e-9),
    ("min_p", 0.0),
    ("min_p", 1.0),
    ("seed", 0),
    ("seed", 2**63 - 1),
    ("seed", None),
    ("stop", []),
    ("stop", "one string"),
    ("stop", ("a", "b")),
    ("stop", ["\n", "\x1b[0m", "\t"]),
    ("stop_token_ids", []),
    ("stop_token_ids", [0, 10**6]),  # the vocabulary bound is checked per request, against the model
    ("ignore_eos", True),
    ("include_stop_str_in_output", True),
    ("skip_special_tokens", False),
    ("n", 1),
    ("n", 128),
    ("response_format", None),
    ("response_format", JsonSchema(json_schema={"type": "object"})),
    ("response_format", JsonSchema()),
    ("response_format", Regex(pattern="[ab]+")),
    ("response_format", Grammar(ebnf='root ::= "x"')),
    ("repetition_penalty", 1),
    ("repetition_penalty", 1e-9),
    ("repetition_penalty", 0.5),
    ("repetition_penalty", 1e6),
    ("presence_penalty", -2),
    ("presence_penalty", 2.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", -2.0),
    ("frequency_penalty", 2),
    ("logprobs", None),
    ("logprobs", 0),
    ("logprobs", 20),
    ("prompt_logprobs", None),
    ("prompt_logprobs", 0),
    ("prompt_logprobs", 20),
]

SP_REJECTED = (
    [
        # limits
        ("max_tokens", 0, "greater than or equal to 1"),
        ("max_tokens", -1, "greater than or equal to 1"),
        ("temperature", -0.1, "greater than or equal to 0"),
        ("temperature", -1e-300, "greater than or equal to 0"),
        ("temperature", 100.001, "less than or equal to 100"),
        ("temperature", 1e308, "less than or equal to 100"),
        ("top_k", -1, "greater than or equal to 0"),
        ("top_p", 0, "greater than 0"),
        ("top_p", -0.5, "greater than 0"),
        ("top_p", 1.0000001, "less than or equal to 1"),
        ("min_p", -0.01, "greater than or equal to 0"),
        ("min_p", 1.01, "less than or equal to 1"),
        ("seed", -1, "greater than or equal to 0"),
        ("seed", 2**63, "less than 9223372036854775808"),
        ("seed", 2**64, "less than 9223372036854775808"),
        ("repetition_penalty", 0, "greater than 0"),
        ("repetition_penalty", -1.0, "greater than 0"),
        ("repetition_penalty", -1e-300, "greater than 0"),
        ("presence_penalty", -2.001, "greater than or equal to -2"),
        ("presence_penalty", 2.001, "less than or equal to 2"),
        ("presence_penalty", 1e308, "less than or equal to 2"),
        ("frequency_penalty", -3, "greater than or equal to -2"),
        ("frequency_penalty", 2.5, "less than or equal to 2"),
        ("logprobs", -1, "greater than or equal to 0"),
        ("logprobs", 21, "less than or equal to 20"),
        ("logprobs", 10**6, "less than or equal to 20"),
        ("prompt_logprobs", -1, "greater than or equal to 0"),
        ("prompt_logprobs", 21, "less than or equal to 20"),
        # stop strings
        ("stop", "", "non-empty"),
        ("stop", ["ok", ""], "non-empty"),
        ("stop", [5], "valid string"),
        ("stop", [None], "valid string"),
        ("stop", [["a"]], "valid string"),
        ("stop", ["bad \ud800"], "lone surrogate"),
        ("stop", None, "valid list"),
        ("stop", 5, "valid list"),
        # stop token ids
        ("stop_token_ids", [-1], ">= 0"),
        ("stop_token_ids", [1, -5], ">= 0"),
        ("stop_token_ids", ["1"], "valid integer"),
        ("stop_token_ids", [1.0], "valid integer"),
        ("stop_token_ids", [True], "valid integer"),
        ("stop_token_ids", [None], "valid integer"),
        ("stop_token_ids", None, "valid list"),
        ("stop_token_ids", 7, "valid list"),
        ("stop_token_ids", "1,2", "valid list"),
        # samples
        ("n", 0, "greater than or equal to 1"),
        ("n", 129, "less than or equal to 128"),
        # response formats (a schema that does not compile fails at submission: test_structured_output.py)
        ("response_format", 5, "must be a JSON Schema dict"),
        ("response_format", "{}", "must be a JSON Schema dict"),
        ("response_format", int, "must be a JSON Schema dict"),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": 3}}, "json_schema.schema"),
        # unknown field
        ("bogus", 1, "Extra inputs are not permitted"),
        ("maxtokens", 16, "Extra inputs are not permitted"),
    ]
    + [(f, v, "valid integer") for f in SP_INT for v in (True, False, "3", 3.0, [3], 1e3)]
    + [(f, None, "valid integer") for f in SP_INT if f not in ("seed", "logprobs", "prompt_logprobs")]
    + [(f, v, "finite number") for f in SP_FLOAT for v in (NAN, INF, -INF)]
    + [(f, v, "valid number") for f in SP_FLOAT for v in (True, False, "0.5", [0.5], None)]
    + [(f, v, "valid boolean") for f in SP_BOOL for v in (1, 0, "yes", "true", None, [True])]
)


def test_sampling_params_tables_cover_every_field():
    fields = set(SamplingParams.model_fields)
    assert set(SP_INT + SP_FLOAT + SP_BOOL + SP_LIST + SP_OTHER) == fields
    assert {f for f, *_ in SP_REJECTED} >= fields
    assert {f for f, _ in SP_ACCEPTED} == fields


@pytest.mark.parametrize("field, value", _ids(SP_ACCEPTED, lambda r: f"{r[0]}={_show(r[1])}"))
def test_sampling_params_accept_values_at_the_limits(field, value):
    p = SamplingParams(**{field: value})
    got = getattr(p, field)
    if field == "stop":
        assert got == ([value] if isinstance(value, str) else list(value))
    else:
        assert got == value and type(got) is type(value if field not in SP_FLOAT else 0.0)


@pytest.mark.parametrize("field, value, fragment", _ids(SP_REJECTED, lambda r: f"{r[0]}={_show(r[1])}"))
def test_sampling_params_reject_bad_values(field, value, fragment):
    with pytest.raises(pydantic.ValidationError) as e:
        SamplingParams(**{field: value})
    _check_validation_error(e.value, field, fragment)


# ---- ModelSpec ---------------------------------------------------------------------------------
DROP = object()  # leave `path` out

MS_ACCEPTED = [
    ("path", "str"),
    ("path", "Path"),
    *[("dtype", d) for d in ("auto", "float32", "float64", "bfloat16", "float16")],
    ("device", "cpu"),
    ("device", "cpu:0"),
    ("device", "meta"),
    ("tokenizer", "dir"),
    ("tokenizer", None),
    ("kv_cache_tokens", 1),
    ("kv_cache_bytes", 1),
    ("block_size", 1),
    ("block_size", 1024),
    ("max_num_seqs", 1),
    ("max_num_seqs", 4096),
    ("max_num_batched_tokens", 1),
    ("max_model_len", 2),
    ("max_model_len", None),
    ("enable_prefix_caching", False),
    *[("onednn_linear", v) for v in (None, True, False)],
    *[("quantization", v) for v in (None, "int8")],
    *[("attention_backend", v) for v in ("auto", "torch", "flashinfer")],
    *[("cuda_graph_max_batch", v) for v in (0, 1, 32, 4096)],
    ("placement", None),
    ("placement", RayPlacement()),
    ("placement", RayPlacement(num_cpus=0, num_gpus=8, resources={"node_large": 1, "accelerator_type:H100": 0.001})),
    ("placement", RayPlacement(num_cpus=0.5, runtime_env={"env_vars": {"A": "1"}, "pip": ["x"]})),
]

MS_REJECTED = [
    ("path", DROP, "Field required"),
    ("path", NO_SUCH_PATH, "does not exist"),
    ("path", "", "is empty"),
    ("path", "   ", "is empty"),
    ("path", 5, "not a valid path"),
    ("path", None, "not a valid path"),
    ("path", ["a"], "not a valid path"),
    ("dtype", "int8", "Input should be 'auto'"),
    ("dtype", "fp16", "Input should be 'auto'"),
    ("dtype", "FLOAT32", "Input should be 'auto'"),
    ("dtype", torch.float32, "Input should be 'auto'"),
    ("dtype", None, "Input should be 'auto'"),
    ("device", "quantum:0", "not a torch device"),
    ("device", "", "not a torch device"),
    ("device", "cpu:-1", "not a torch device"),
    ("device", 0, "valid string"),
    ("device", None, "valid string"),
    ("tokenizer", NO_SUCH_PATH, "does not exist"),
    ("tokenizer", "", "is empty"),
    ("tokenizer", 5, "not a valid path"),
    ("kv_cache_tokens", 0, "greater than or equal to 1"),
    ("kv_cache_tokens", -1, "greater than or equal to 1"),
    ("kv_cache_tokens", True, "valid integer"),
    ("kv_cache_tokens", "1024", "valid integer"),
    ("kv_cache_tokens", 1024.0, "valid integer"),
    ("kv_cache_bytes", 0, "greater than or equal to 1"),
    ("kv_cache_bytes", -5, "greater than or equal to 1"),
    ("kv_cache_bytes", 1e9, "valid integer"),
    ("kv_cache_bytes", True, "valid integer"),
    ("block_size", 0, "greater than or equal to 1"),
    ("block_size", 1025, "less than or equal to 1024"),
    ("block_size", True, "valid integer"),
    ("block_size", 16.0, "valid integer"),
    ("max_num_seqs", 0, "greater than or equal to 1"),
    ("max_num_seqs", 4097, "less than or equal to 4096"),
    ("max_num_seqs", "64", "valid integer"),
    ("max_num_batched_tokens", 0, "greater than or equal to 1"),
    ("max_num_batched_tokens", -1, "greater than or equal to 1"),
    ("max_num_batched_tokens", True, "valid integer"),
    ("max_model_len", 1, "greater than or equal to 2"),
    ("max_model_len", 0, "greater than or equal to 2"),
    ("max_model_len", 64.0, "valid integer"),
    ("max_model_len", False, "valid integer"),
    ("enable_prefix_caching", 1, "valid boolean"),
    ("enable_prefix_caching", 0, "valid boolean"),
    ("enable_prefix_caching", "yes", "valid boolean"),
    ("enable_prefix_caching", None, "valid boolean"),
    ("onednn_linear", 1, "valid boolean"),
    ("onednn_linear", "auto", "valid boolean"),
    ("quantization", "int4", "Input should be 'int8'"),
    ("quantization", "INT8", "Input should be 'int8'"),
    ("quantization", 8, "Input should be 'int8'"),
    ("attention_backend", "triton", "'auto', 'torch' or 'flashinfer'"),
    ("attention_backend", None, "'auto', 'torch' or 'flashinfer'"),
    ("attention_backend", "", "'auto', 'torch' or 'flashinfer'"),
    ("cuda_graph_max_batch", -1, "greater than or equal to 0"),
    ("cuda_graph_max_batch", 4097, "less than or equal to 4096"),
    ("cuda_graph_max_batch", 8.0, "valid integer"),
    ("cuda_graph_max_batch", True, "valid integer"),
    ("bogus", 1, "Extra inputs are not permitted"),
    ("maxmodellen", 64, "Extra inputs are not permitted"),
    ("placement", 5, "valid dictionary or instance of RayPlacement"),
    ("placement", "node_large", "valid dictionary or instance of RayPlacement"),
    ("placement", {"num_cpus": -1}, "greater than or equal to 0"),
    ("placement", {"num_cpus": 2000}, "less than or equal to 1024"),
    ("placement", {"num_cpus": NAN}, "finite number"),
    ("placement", {"num_cpus": True}, "valid number"),
    ("placement", {"num_cpus": "1"}, "valid number"),
    ("placement", {"num_gpus": -0.5}, "greater than or equal to 0"),
    ("placement", {"num_gpus": INF}, "finite number"),
    ("placement", {"resources": {"CPU": 1}}, "give 'CPU' as num_cpus / num_gpus"),
    ("placement", {"resources": {"GPU": 1}}, "give 'GPU' as num_cpus / num_gpus"),
    ("placement", {"resources": {"node": 0}}, "must be a finite number > 0"),
    ("placement", {"resources": {"node": INF}}, "must be a finite number > 0"),
    ("placement", {"resources": {"node": "1"}}, "must be a number"),
    ("placement", {"resources": {"node": True}}, "must be a number"),
    ("placement", {"resources": {" ": 1}}, "non-empty string"),
    ("placement", {"resources": {1: 1}}, "valid string"),
    ("placement", {"resources": ["node"]}, "valid dictionary"),
    ("placement", {"runtime_env": {"env_vars": {"A": 1}}}, "env_vars must be a dict of str -> str"),
    ("placement", {"runtime_env": "env"}, "valid dictionary"),
    ("placement", {"bogus": 1}, "Extra inputs are not permitted"),
]


def test_model_spec_tables_cover_every_field():
    fields = set(ModelSpec.model_fields)
    assert {f for f, *_ in MS_REJECTED} >= fields
    assert {f for f, _ in MS_ACCEPTED} == fields


@pytest.mark.parametrize("field, value", _ids(MS_ACCEPTED, lambda r: f"{r[0]}={_show(r[1])}"))
def test_model_spec_accepts_values_at_the_limits(tmp_path, field, value):
    if field == "path":
        spec = ModelSpec(path=str(tmp_path) if value == "str" else tmp_path)
        assert spec.path == tmp_path
        return
    if value == "dir":
        value = tmp_path
    spec = ModelSpec(path=tmp_path, **{field: value})
    assert getattr(spec, field) == value


@pytest.mark.parametrize("field, value, fragment", _ids(MS_REJECTED, lambda r: f"{r[0]}={_show(r[1])}"))
def test_model_spec_rejects_bad_values(tmp_path, field, value, fragment):
    kwargs = {"path": tmp_path}
    if value is DROP:
        del kwargs[field]
    else:
        kwargs[field] = value
    with pytest.raises(pydantic.ValidationError) as e:
        ModelSpec(**kwargs)
    _check_validation_error(e.value, field, fragment)


def test_a_placed_models_path_is_checked_where_its_actor_runs(tmp_path):
    """With a placement the path (and tokenizer, and store name) are the actor's node's to
    resolve: a large model's weights need only be on the GPU node."""
    spec = ModelSpec(path=NO_SUCH_PATH, tokenizer=NO_SUCH_PATH, placement=RayPlacement())
    assert str(spec.path) == NO_SUCH_PATH and str(spec.tokenizer) == NO_SUCH_PATH
    assert str(ModelSpec(path="smollm2", placement=RayPlacement()).path) == "smollm2"
    with pytest.raises(pydantic.ValidationError, match="is empty"):
        ModelSpec(path="", placement=RayPlacement())


def test_model_spec_rejects_both_kv_budgets(tmp_path):
    with pytest.raises(pydantic.ValidationError) as e:
        ModelSpec(path=tmp_path, kv_cache_tokens=16, kv_cache_bytes=1 << 20)
    assert "kv_cache_tokens or kv_cache_bytes, not both" in str(e.value)


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
    return [(f"{param}={_show(v)}", {"models": ONE, param: v}, ConfigError, param, frag) for v, frag in values]


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
    assert set(engine.specs) == set(kwargs["models"])
    assert all(spec.path == tiny_model for spec in engine.specs.values())
    assert not engine.workers  # constructing starts nothing


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
        assert not engine.workers and not engine.loaded
        with pytest.raises(EngineNotRunningError):
            await engine.generate([1, 2, 3])

    anyio.run(main)
    deadline = time.monotonic() + 10
    while any(t.name.endswith(("-native", "-alien")) for t in _worker_threads()):
        assert time.monotonic() < deadline, "the workers of a rejected engine did not stop"
        time.sleep(0.01)


# ---- requests on a running engine --------------------------------------------------------------
MAX_MODEL_LEN = 64
GOOD = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


def _msg(role="user", content="hi"):
    return {"role": role, "content": content}


# (id, prompt or prompt(V) with V the vocabulary size, the field named, a fragment of the message)
PROMPT_REJECTED = [
    # text
    ("empty-str", "", "prompt", "is empty"),
    ("bytes", b"hello", "prompt", "not bytes"),
    ("bytes-invalid-utf8", b"\xff\xfe\xfd", "prompt", "not bytes"),
    ("bytearray", bytearray(b"hi"), "prompt", "not bytes"),
    ("memoryview", memoryview(b"hi"), "prompt", "not bytes"),
    ("lone-surrogate", "bad \ud800 text", "prompt", "lone surrogate"),
    ("split-surrogate-pair", "\ud83d\ude00", "prompt", "lone surrogate"),
    ("nul", "a\x00b", "prompt", "NUL"),
    ("only-nul", "\x00", "prompt", "NUL"),
    ("too-long-text", "x " * 200, "prompt", f"context holds {MAX_MODEL_LEN}"),
    # not a prompt at all
    ("none", None, "prompt", "got NoneType"),
    ("int", 42, "prompt", "got int"),
    ("float", 1.5, "prompt", "got float"),
    ("set", {1, 2}, "prompt", "got set"),
    ("bare-message", _msg(), "prompt", "got dict"),
    # token ids
    ("empty-list", [], "prompt", "is empty"),
    ("empty-tuple", (), "prompt", "is empty"),
    ("id-negative", [1, -1], "prompt", "token id -1 is outside the vocabulary"),
    ("id-vocab-size", lambda V: [1, V], "prompt", "outside the vocabulary"),
    ("id-huge", [10**20], "prompt", "outside the vocabulary"),
    ("id-bool", [True], "prompt", "item 0 is bool"),
    ("id-bool-mixed", [1, False], "prompt", "item 1 is bool"),
    ("id-str", [1, "2"], "prompt", "item 1 is str"),
    ("id-float", [1, 2.0], "prompt", "item 1 is float"),
    ("id-none", [1, None], "prompt", "item 1 is NoneType"),
    ("id-then-message", [1, _msg()], "prompt", "item 1 is dict"),
    ("nested-ids", [[1, 2]], "prompt", "item 0 is list"),
    ("nested-messages", [[_msg()]], "prompt", "item 0 is list"),
    ("too-long-ids", [1] * MAX_MODEL_LEN, "prompt", f"is {MAX_MODEL_LEN} tokens"),
    # chat messages
    ("role-unknown", [_msg("wizard")], "prompt[0].role", "unknown role 'wizard'"),
    ("role-case", [_msg("User")], "prompt[0].role", "unknown role"),
    ("role-missing", [{"content": "hi"}], "prompt[0].role", "unknown role None"),
    ("role-not-str", [_msg(["user"])], "prompt[0].role", "unknown role"),
    ("role-second", [_msg(), _msg("bot")], "prompt[1].role", "unknown role 'bot'"),
    ("content-missing", [{"role": "user"}], "prompt[0].content", "must be a string"),
    ("content-none-user", [_msg(content=None)], "prompt[0].content", "must be a string"),
    ("content-int", [_msg(content=3)], "prompt[0].content", "must be a string"),
    ("content-parts", [_msg(content=[{"type": "text", "text": "hi"}])], "prompt[0].content", "must be a string"),
    ("content-surrogate", [_msg(content="\udfff")], "prompt[0].content", "lone surrogate"),
    ("content-nul", [_msg(content="a\x00")], "prompt[0].content", "NUL"),
    ("message-str", [_msg(), "hi"], "prompt[1]", "must be a dict, got str"),
    ("message-ids", [_msg(), 5], "prompt[1]", "must be a dict, got int"),
    ("too-long-chat", [_msg(content="x " * 200)], "prompt", f"context holds {MAX_MODEL_LEN}"),
]

# (id, params or params(V), request_id, field, fragment)
OTHER_REJECTED = [
    ("params-dict", {"max_tokens": 3}, None, "params", "must be SamplingParams, got dict"),
    ("params-str", "greedy", None, "params", "got str"),
    ("params-class", SamplingParams, None, "params", "got "),
    ("stop-id-vocab-size", lambda V: SamplingParams(stop_token_ids=[V]), None, "stop_token_ids", "outside"),
    ("stop-id-huge", SamplingParams(stop_token_ids=[1, 10**12]), None, "stop_token_ids", "outside"),
    ("request-id-empty", GOOD, "", "request_id", "non-empty string"),
    ("request-id-int", GOOD, 7, "request_id", "non-empty string"),
    ("request-id-bytes", GOOD, b"r1", "request_id", "non-empty string"),
]

PROMPT_ACCEPTED = [
    ("ansi-escape", "\x1b[31mred\x1b[0m text"),
    ("tab-newline-cr", "a\tb\nc\r\nd"),
    ("other-controls", "bell\x07 backspace\x08 form-feed\x0c del\x7f"),
    ("unicode", "Ünïcödé 🙂 你好"),
    ("one-char", "a"),
    ("id-zero", [0]),
    ("id-last", lambda V: [V - 1]),
    ("ids-tuple", (1, 2, 3)),
    ("longest-ids", [1] * (MAX_MODEL_LEN - 1)),
    ("chat-every-role", [_msg(r) for r in ("system", "developer", "user", "assistant", "tool")]),
    ("chat-assistant-none", [_msg(), _msg("assistant", None), _msg()]),
    ("chat-extra-keys", [{"role": "user", "content": "hi", "name": "bob"}]),
    ("chat-controls", [_msg(content="\x1b[1mbold\x1b[0m\tand\nlines")]),
]


@pytest.fixture(scope="module")
def running(tiny_model, tokenizer):
    """One engine for the whole module, on an event loop in a background thread."""
    spec = ModelSpec(path=tiny_model, dtype="float64", kv_cache_tokens=1024, max_model_len=MAX_MODEL_LEN)
    engine = Engine(models={"m": spec})
    with anyio.from_thread.start_blocking_portal() as portal, portal.wrap_async_context_manager(engine):
        yield engine, portal, len(tokenizer)


class _Spy:
    """Counts what is submitted to a worker (and passes it on)."""

    def __init__(self, worker):
        self.real, self.submitted = worker.submit, []

    def __call__(self, req):
        self.submitted.append(req.request_id)
        return self.real(req)


def _settle(worker, timeout: float = 10.0):
    """Wait until the worker holds nothing and its step count no longer moves."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        s = worker.stats()
        if s.running == s.waiting == s.pending == 0 and s.kv_blocks_free == s.kv_blocks_total and s.steps == last:
            return s
        assert time.monotonic() < deadline, f"worker did not settle: {s}"
        last = s.steps
        time.sleep(0.005)


async def _consume(engine, how, prompt, params, request_id):
    kwargs = {} if request_id is None else {"request_id": request_id}
    if how == "generate":
        return await engine.generate(prompt, params, **kwargs)
    async for _ in engine.stream(prompt, params, **kwargs):
        pass


def _rejected(running, monkeypatch, how, prompt, params, request_id, field, fragment):
    engine, portal, vocab = running
    prompt = prompt(vocab) if callable(prompt) else prompt
    params = params(vocab) if callable(params) and not isinstance(params, type) else params
    worker = engine.workers["m"]
    before = _settle(worker)
    spy = _Spy(worker)
    monkeypatch.setattr(worker, "submit", spy)
    with pytest.raises(TokenRouterError) as e:
        portal.call(_consume, engine, how, prompt, params, request_id)
    assert type(e.value) is InvalidRequestError, f"{type(e.value).__name__}: {e.value}"
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"{field}: ") and fragment in str(e.value), str(e.value)
    # none reaches a worker
    assert spy.submitted == []
    assert not worker.inbox and not worker.core.seqs and not engine.tracker.channels
    after = worker.stats()
    assert (after.steps, after.tokens_processed) == (before.steps, before.tokens_processed)
    # and the engine goes on serving
    out = portal.call(engine.generate, [1, 2, 3], GOOD)
    assert out.finish_reason == "length" and len(out.token_ids) == 2
    assert len(spy.submitted) == 1


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("prompt, field, fragment", [pytest.param(*r[1:], id=r[0]) for r in PROMPT_REJECTED])
def test_bad_prompt_is_rejected_before_any_worker(running, monkeypatch, how, prompt, field, fragment):
    _rejected(running, monkeypatch, how, prompt, GOOD, None, field, fragment)


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("params, request_id, field, fragment", [pytest.param(*r[1:], id=r[0]) for r in OTHER_REJECTED])
def test_bad_params_or_request_id_is_rejected_before_any_worker(
    running, monkeypatch, how, params, request_id, field, fragment
):
    _rejected(running, monkeypatch, how, [1, 2, 3], params, request_id, field, fragment)


@pytest.mark.parametrize("prompt", [pytest.param(r[1], id=r[0]) for r in PROMPT_ACCEPTED])
def test_unusual_but_valid_prompts_are_served(running, monkeypatch, prompt):
    engine, portal, vocab = running
    prompt = prompt(vocab) if callable(prompt) else prompt
    worker = engine.workers["m"]
    spy = _Spy(worker)
    monkeypatch.setattr(worker, "submit", spy)
    out = portal.call(engine.generate, prompt, GOOD)
    room = MAX_MODEL_LEN - len(out.prompt_token_ids)  # max_tokens is capped to what the context holds
    assert out.finish_reason == "length" and len(out.token_ids) == min(GOOD.max_tokens, room)
    assert len(spy.submitted) == 1


def test_duplicate_request_id_is_rejected_while_the_first_runs(running, monkeypatch):
    engine, portal, _ = running
    worker = engine.workers["m"]
    _settle(worker)
    spy = _Spy(worker)
    monkeypatch.setattr(worker, "submit", spy)

    async def main():
        first = engine.stream([1, 2, 3], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), request_id="r1")
        try:
            await first.__anext__()  # r1 is in flight
            for how in ("generate", "stream"):
                with pytest.raises(InvalidRequestError) as e:
                    await _consume(engine, how, [4, 5], GOOD, "r1")
                assert e.value.field == "request_id" and "'r1' is already in use" in str(e.value)
        finally:
            await first.aclose()

    portal.call(main)
    assert spy.submitted == ["r1"]  # only the first
    _settle(worker)
    # once it has ended, the id is free again
    assert portal.call(partial(engine.generate, [4, 5], GOOD, request_id="r1")).finish_reason == "length"
