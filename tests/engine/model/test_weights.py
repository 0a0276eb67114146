"""Streaming a safetensors checkpoint into a model (engine/model/weights.py): the same model as
`from_pretrained` builds, tensor for tensor, or None where it cannot stream (then the loader
falls back to `from_pretrained`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from tokenrouter.engine.model.weights import checkpoint_files, load_streaming
from tokenrouter.testing import build_tiny_model


def _same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert dict(a.named_buffers()).keys() == dict(b.named_buffers()).keys()
    for (k, x), (_, y) in zip(a.named_buffers(), b.named_buffers()):
        assert torch.equal(x, y), k  # rotary frequencies and the like, computed at construction
    assert a.generation_config.eos_token_id == b.generation_config.eos_token_id


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streamed_model_equals_from_pretrained(tmp_path, tokenizer, arch, tied, dtype):
    path = build_tiny_model(tmp_path / arch, arch, dtype=torch.bfloat16, tokenizer=tokenizer, tie_word_embeddings=tied)
    config = AutoConfig.from_pretrained(path)
    streamed = load_streaming(config, path, dtype, "eager")
    assert streamed is not None
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    _same_model(streamed, reference)
    if tied:
        assert streamed.get_output_embeddings().weight is streamed.get_input_embeddings().weight
    ids = torch.tensor([[5, 9, 17, 3]])
    with torch.no_grad():
        torch.testing.assert_close(streamed(ids).logits, reference(ids).logits, rtol=0, atol=0)


def test_shards_are_read_through_their_index(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer)
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    (path / "model.safetensors").unlink()
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, path / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert [p.name for p in checkpoint_files(path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    config = AutoConfig.from_pretrained(path)
    _same_model(
        load_streaming(config, path, torch.float32, "eager"),
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager"),
    )


def test_a_checkpoint_with_other_names_is_left_to_from_pretrained(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer)
    tensors = load_file(path / "model.safetensors")
    save_file({"renamed." + k: v for k, v in tensors.items()}, path / "model.safetensors", metadata={"format": "pt"})
    assert load_streaming(AutoConfig.from_pretrained(path), path, torch.float32, "eager") is None


def test_a_checkpoint_missing_a_weight_is_left_to_from_pretrained(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", "qwen2", tokenizer=tokenizer, tie_word_embeddings=False)
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    assert load_streaming(AutoConfig.from_pretrained(path), path, torch.float32, "eager") is None


def test_only_a_load_of_many_megabytes_trims_the_heap(tmp_path, tokenizer, monkeypatch):
    """Trimming the heap after a load collects the whole process's garbage (0.2-0.4 s with
    transformers loaded): worth it after a real model's load, not after a few MB (a test's)."""
    from tokenrouter import ModelSpec
    from tokenrouter.engine import native
    from tokenrouter.engine.model import loader

    trims = []
    monkeypatch.setattr(native, "trim_heap", lambda *a, **k: trims.append(1))
    path = build_tiny_model(tmp_path / "m", arch="qwen2", tokenizer=tokenizer)
    ckpt = loader.locate_checkpoint(path)
    assert 0 < loader.weight_bytes(ckpt) < loader.TRIM_MIN_BYTES
    loader.load_model("m", ModelSpec(path=str(path), dtype="float32"))
    assert trims == []
    monkeypatch.setattr(loader, "TRIM_MIN_BYTES", 1)
    loader.load_model("m", ModelSpec(path=str(path), dtype="float32"))
    assert trims == [1]
