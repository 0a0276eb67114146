"""A GGUF's built kernels are kept and read back: the same kernels, none built again."""

from __future__ import annotations

import os

import pytest
import torch

from tokenrouter import ModelSpec
from tokenrouter.engine.model import load_model
from tokenrouter.engine.quant import gguf_native, int4, int8_weights, kernel_cache, kernels
from tokenrouter.testing import build_tiny_model, write_gguf


@pytest.fixture
def gguf_model(tmp_path, tokenizer, monkeypatch):
    """A tiny Qwen2 with its GGUF beside it, its kernels kept in tmp_path/kernels.safetensors.
    torch's kernels serve (the cache is theirs): where the GGUF block kernels build, the probe
    would pick them or not by the machine's timings."""
    path = build_tiny_model(
        tmp_path / "m", "qwen2", tokenizer=tokenizer, hidden_size=256, intermediate_size=320, num_attention_heads=4
    )
    write_gguf(path)  # Q4_K where rows are multiples of 256 long, Q8_0 elsewhere
    cache = tmp_path / "kernels.safetensors"
    monkeypatch.setattr(kernel_cache, "cache_path", lambda gguf_path, home=None: cache)
    monkeypatch.setenv(gguf_native.ENV, "off")
    return path, cache


def _load(path, quantization="gguf"):
    return load_model("m", ModelSpec(path=path, dtype="bfloat16", quantization=quantization)).model


def _outputs(model) -> dict[str, torch.Tensor]:
    """Every quantized layer's output on one input (the model's forward runs only inside an engine)."""
    torch.manual_seed(0)
    out = {}
    with torch.no_grad():
        for name, layer in model.named_modules():
            if isinstance(layer, (int4.Int4Linear, int8_weights.Int8WeightLinear)):
                out[name.removesuffix(".few")] = layer(torch.randn(3, layer.in_features, dtype=torch.bfloat16))
    return out


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _layers(model, kind):
    """By the model's layer name (under gguf+bf16 the quantized kernel is its layer's `few`)."""
    return {n.removesuffix(".few"): m for n, m in model.named_modules() if isinstance(m, kind)}


def test_a_second_load_reads_the_kernels_the_first_built(gguf_model, monkeypatch):
    path, cache = gguf_model
    first = _load(path)
    assert cache.is_file()
    built4, built8 = _layers(first, int4.Int4Linear), _layers(first, int8_weights.Int8WeightLinear)
    assert built4 and built8

    def no_building(*args, **kwargs):
        raise AssertionError("a kernel was built although the cache holds it")

    monkeypatch.setattr(kernels, "q4k_groups", no_building)
    monkeypatch.setattr(int8_weights.Int8WeightLinear, "from_rows", no_building)
    for quantization in ("gguf", "gguf+bf16"):  # both modes share the quantized kernels
        second = _load(path, quantization)
        read4, read8 = _layers(second, int4.Int4Linear), _layers(second, int8_weights.Int8WeightLinear)
        assert read4.keys() == built4.keys() and read8.keys() == built8.keys()
        for name, layer in read4.items():
            assert torch.equal(layer.packed, built4[name].packed)
            assert torch.equal(layer.scales_and_zeros, built4[name].scales_and_zeros)
            assert (layer.out_features, layer.in_features) == (built4[name].out_features, built4[name].in_features)
        for name, layer in read8.items():
            assert torch.equal(layer.qweight, built8[name].qweight) and torch.equal(layer.scales, built8[name].scales)
        assert _equal(_outputs(second), _outputs(first))


def test_a_damaged_cache_is_built_again_and_rewritten(gguf_model):
    path, cache = gguf_model
    expected = _outputs(_load(path))
    cache.write_bytes(b"not a safetensors file")
    assert _equal(_outputs(_load(path)), expected)
    assert kernel_cache.read(cache) is not None  # rewritten whole


def test_only_the_stores_ggufs_are_cached_one_file_a_model(tmp_path):
    home = tmp_path / "home"
    (home / "gguf").mkdir(parents=True)
    outside = tmp_path / "mine.gguf"
    outside.write_bytes(b"GGUF")
    assert kernel_cache.cache_path(outside, home) is None
    inside = home / "gguf" / "qwen-coder-1.5b.gguf"
    inside.write_bytes(b"GGUF one")
    path = kernel_cache.cache_path(inside, home)
    assert path.parent == home / "kernels" and path.name.startswith("qwen-coder-1.5b-")
    kernel_cache.write(path, {"x": torch.arange(4, dtype=torch.int32)})
    inside.write_bytes(b"GGUF, another version")  # another file: another key, replacing the old one
    os.utime(inside, ns=(1, 1))
    newer = kernel_cache.cache_path(inside, home)
    assert newer != path
    kernel_cache.write(newer, {"x": torch.ones(2, dtype=torch.bfloat16)})
    assert sorted(p.name for p in (home / "kernels").iterdir()) == [newer.name]
    assert torch.equal(kernel_cache.read(newer)["x"], torch.ones(2, dtype=torch.bfloat16))
