"""Stream a safetensors checkpoint into a model, one tensor at a time, so loading never holds much
more than the model itself.

transformers' `from_pretrained` memory-maps the checkpoint and converts every tensor from it:
every page of the file it touched stays in the process's resident set until the whole load ends.
For the demo pair, stored in bfloat16 and computed in float32, that is the model plus half of it
again (the 1.5B peaked at 10.8 GB to hold 7.3). Here the model is built with its parameters on
the meta device (buffers such as rotary frequencies are computed as usual), and each tensor is
read from the file into a buffer of its own, converted to the compute dtype and registered in
place of its meta parameter; the buffer is freed before the next one is read.

Only checkpoints whose tensor names are exactly the model's own are streamed (what the engine's
dense copies of a GGUF hold, and what most Hugging Face directories hold); anything else (renamed
or fused keys) returns None and the caller uses `from_pretrained`. `load_from_gguf` fills the same
empty model from a GGUF's tensors (read by quant/gguf_weights.py), one at a time alike.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from ...errors import ModelLoadError
from .. import native
from ..quant import GGUFWeights

# safetensors' dtype names
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def checkpoint_files(directory: Path) -> list[Path] | None:
    """The safetensors files of a model directory (one file, or the shards its index names)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / s for s in shards]
    return None


def read_header(path: Path) -> tuple[dict, int]:
    """(tensor name -> {dtype, shape, data_offsets}, offset where the data starts)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def empty_model(config, dtype: torch.dtype, attn_implementation: str) -> torch.nn.Module:
    """The model with its parameters on the meta device (buffers such as rotary frequencies are
    computed as usual), for `put` to fill."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)


def load_streaming(
    config, directory: Path, dtype: torch.dtype, attn_implementation: str, skip: set[str] = frozenset()
) -> torch.nn.Module | None:
    """The model with every weight read from `directory`'s safetensors, or None if this
    checkpoint cannot be streamed (its names are not the model's own). Parameters named in
    `skip` are not read: they stay on the meta device for the caller to fill (from a GGUF)."""
    files = checkpoint_files(directory)
    if files is None:
        return None
    headers = [(path, *read_header(path)) for path in files]
    names = {name for _, header, _ in headers for name in header}
    model = empty_model(config, dtype, attn_implementation)
    expected = set(model.state_dict(keep_vars=True))
    if not names <= expected or any(h[n]["dtype"] not in _DTYPES for _, h, _ in headers for n in h):
        return None
    for path, header, start in headers:
        with open(path, "rb") as f:
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                if name in skip:
                    continue
                begin, end = info["data_offsets"]
                raw = torch.empty(end - begin, dtype=torch.uint8)
                f.seek(start + begin)
                if f.readinto(raw.numpy()) != end - begin:
                    raise OSError(f"{path}: truncated tensor {name}")
                stored = raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])
                put(model, name, stored.to(dtype) if stored.is_floating_point() else stored.clone())
                del raw, stored
    model.tie_weights()
    params = model.named_parameters(remove_duplicate=False)
    if any(p.is_meta and n not in skip for n, p in params) or any(b.is_meta for b in model.buffers()):
        return None  # something the file does not hold (and no tie provides): let transformers decide
    return finish(model, directory)


def finish(model: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """The generation config beside the weights (EOS ids and defaults, as from_pretrained reads
    them), and eval mode."""
    if (directory / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    return model.eval()


def put(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Register `tensor` as the parameter (or persistent buffer) `name` of `model`."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    if leaf in dict(module.named_parameters(recurse=False)):
        module.register_parameter(leaf, torch.nn.Parameter(tensor))
    else:
        module.register_buffer(leaf, tensor)


def load_from_gguf(
    config, gguf: GGUFWeights, files: Path, dtype: torch.dtype, attn_implementation: str, skip: set[str]
) -> torch.nn.Module:
    """The model with every parameter read from the GGUF, dense in `dtype`, but those in `skip`
    (left on the meta device for the kernels to fill from their blocks); its generation config
    from `files`."""
    model = empty_model(config, dtype, attn_implementation)
    for name, param in list(model.named_parameters()):
        if name in skip or not param.is_meta:
            continue
        values = gguf.dense(name)
        if values is not None:
            put(model, name, values.to(dtype))
            native.trim_heap(collect=False)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta and n not in skip]
    if missing:
        raise ModelLoadError(f"{gguf.path}: the GGUF holds no tensor for {', '.join(missing[:3])}")
    return finish(model, files)
