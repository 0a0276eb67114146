"""Bad input to ModelSpec, table-driven: every field at and beyond its limits, wrong types, paths
that do not exist, budgets that conflict (tests/bad_input.py)."""

from __future__ import annotations

import pydantic
import pytest
import torch

from tests.bad_input import INF, NAN, NO_SUCH_PATH, check_validation_error, ids, show
from tokenrouter import (
    ModelSpec,
    RayPlacement,
)

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
    *[("deterministic", v) for v in (True, False)],
    *[("quantization", v) for v in (None, "int8", "gguf")],
    *[("draft_vocab", v) for v in (None, 1, 32768)],
    *[("attention_backend", v) for v in ("auto", "torch", "cpu", "flashinfer")],
    *[("prefill_backend", v) for v in ("auto", "fa2", "fa3")],
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
    ("deterministic", 1, "valid boolean"),
    ("deterministic", "yes", "valid boolean"),
    ("onednn_linear", "auto", "valid boolean"),
    ("quantization", "int4", "Input should be 'auto', 'gguf', 'gguf+bf16' or 'int8'"),
    ("quantization", "INT8", "Input should be 'auto', 'gguf', 'gguf+bf16' or 'int8'"),
    ("quantization", 8, "Input should be 'auto', 'gguf', 'gguf+bf16' or 'int8'"),
    ("draft_vocab", 0, "greater than or equal to 1"),
    ("draft_vocab", 32768.0, "valid integer"),
    ("draft_vocab", "32768", "valid integer"),
    ("attention_backend", "triton", "'auto', 'torch', 'cpu' or 'flashinfer'"),
    ("attention_backend", None, "'auto', 'torch', 'cpu' or 'flashinfer'"),
    ("attention_backend", "", "'auto', 'torch', 'cpu' or 'flashinfer'"),
    ("prefill_backend", "fa4", "'auto', 'fa2' or 'fa3'"),
    ("prefill_backend", "FA2", "'auto', 'fa2' or 'fa3'"),
    ("prefill_backend", None, "'auto', 'fa2' or 'fa3'"),
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


@pytest.mark.parametrize("field, value", ids(MS_ACCEPTED, lambda r: f"{r[0]}={show(r[1])}"))
def test_model_spec_accepts_values_at_the_limits(tmp_path, field, value):
    if field == "path":
        spec = ModelSpec(path=str(tmp_path) if value == "str" else tmp_path)
        assert spec.path == tmp_path
        return
    if value == "dir":
        value = tmp_path
    spec = ModelSpec(path=tmp_path, **{field: value})
    assert getattr(spec, field) == value


@pytest.mark.parametrize("field, value, fragment", ids(MS_REJECTED, lambda r: f"{r[0]}={show(r[1])}"))
def test_model_spec_rejects_bad_values(tmp_path, field, value, fragment):
    kwargs = {"path": tmp_path}
    if value is DROP:
        del kwargs[field]
    else:
        kwargs[field] = value
    with pytest.raises(pydantic.ValidationError) as e:
        ModelSpec(**kwargs)
    check_validation_error(e.value, field, fragment)


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
