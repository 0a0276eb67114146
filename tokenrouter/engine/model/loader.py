"""Load a decoder-only model and its tokenizer from a local Hugging Face directory or a GGUF file.

transformers supplies the model definition, config, tokenizer, chat template and weight loading;
the only thing the engine changes is the attention function, so that it owns the KV cache.
Safetensors checkpoints are read one tensor at a time (`weights.py`), so that loading peaks
near the memory the model then holds.
Nothing here ever reaches the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...config import ModelSpec
from ...errors import ModelLoadError
from ..attention import backend as attention
from .linear import int8 as int8_linear
from .linear import onednn as onednn_linear
from .weights import load_streaming

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class LoadedModel:
    name: str
    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: object
    dtype: torch.dtype
    device: torch.device
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    # "onednn" when the linear layers were packed (engine/model/linear/onednn.py); "int8+onednn" or
    # "int8+torch" when quantized (engine/model/linear/int8.py), the kept float32 ones on the named kernel
    linear_kernel: str = "torch"


def resolve_dtype(spec: ModelSpec, config) -> torch.dtype:
    """'auto' computes in float32 on CPU (no native bf16 matmuls there) and in the checkpoint's dtype elsewhere."""
    if spec.dtype != "auto":
        return _DTYPES[spec.dtype]
    if torch.device(spec.device).type == "cpu":
        return torch.float32
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = _DTYPES.get(stored)
    return stored if isinstance(stored, torch.dtype) and stored.is_floating_point else torch.bfloat16


def locate_checkpoint(path: Path) -> tuple[Path, str | None]:
    """(directory, gguf file name or None) for a model path."""
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file must be a .gguf file or a directory: {path}")
        return path.parent, path.name
    if (path / "config.json").exists():
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise ModelLoadError(f"no weights (*.safetensors) in model directory: {path}")
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    raise ModelLoadError(f"not a model directory (no config.json, and not exactly one .gguf file): {path}")


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    directory, gguf = locate_checkpoint(Path(spec.path))
    try:
        if spec.tokenizer is not None:
            return AutoTokenizer.from_pretrained(spec.tokenizer, local_files_only=True)
        return AutoTokenizer.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load a tokenizer for {spec.path}: {e}") from e


def load_model(name: str, spec: ModelSpec) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    attention.register()
    directory, gguf = locate_checkpoint(Path(spec.path))
    try:
        config = AutoConfig.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the model config of {spec.path}: {e}") from e
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{spec.path}: encoder-decoder models are not supported, only decoder-only ones")
    dtype = resolve_dtype(spec, config)
    device = _usable_device(spec)
    try:
        model = None if gguf is not None else load_streaming(config, directory, dtype, attention.ATTN_IMPLEMENTATION)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(
                directory,
                gguf_file=gguf,
                dtype=dtype,
                attn_implementation=attention.ATTN_IMPLEMENTATION,
                local_files_only=True,
            )
    except ValueError as e:
        raise ModelLoadError(f"{spec.path}: transformers cannot build a causal LM from it: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load the weights of {spec.path}: {e}") from e
    _check_attention(spec, model)
    model.to(device).eval()
    vocab_size = model.get_output_embeddings().weight.shape[0]
    quantized = _quantize_linears(spec, model, dtype, device)
    linear_kernel = quantized + _pack_linears(spec, model, dtype, device)
    tokenizer = load_tokenizer(spec)
    return LoadedModel(
        name=name,
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        device=device,
        vocab_size=vocab_size,
        max_model_len=_max_model_len(spec, model.config, tokenizer),
        eos_token_ids=_eos_ids(model, tokenizer),
        linear_kernel=linear_kernel,
    )


def _check_attention(spec: ModelSpec, model: torch.nn.Module) -> None:
    """The attention variants the paged backends do not compute fail at load, naming the reason,
    not at the first step: logit soft-capping (Gemma 2) and learned attention sinks (gpt-oss)."""
    text = model.config.get_text_config()
    if getattr(text, "attn_logit_softcapping", None):
        raise ModelLoadError(
            f"{spec.path}: {type(model).__name__} caps its attention logits (attn_logit_softcapping), "
            "which the paged attention backends do not support"
        )
    if any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in model.modules()):
        raise ModelLoadError(
            f"{spec.path}: {type(model).__name__} uses learned attention sinks, which the paged attention "
            "backends do not support"
        )


def _usable_device(spec: ModelSpec) -> torch.device:
    device = torch.device(spec.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device={spec.device!r} for {spec.path}: this torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device={spec.device!r} for {spec.path}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    return device


def _quantize_linears(spec: ModelSpec, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> str:
    """ "int8+" if the linear layers were quantized (`spec.quantization`), else ""."""
    if spec.quantization is None:
        return ""
    if not int8_linear.applies(device, dtype):
        why = f"it needs float32 on CPU, not {dtype} on {device}"
        if not int8_linear.available():
            why = "this torch build has no fbgemm int8 kernels"
        raise ModelLoadError(f"quantization={spec.quantization!r} for {spec.path}: {why}")
    return "int8+" if int8_linear.quantize_linears(model) else ""


def _pack_linears(spec: ModelSpec, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> str:
    """Which kernel the linear layers now run on: "onednn" if they were packed, else "torch"."""
    if spec.onednn_linear is False:
        return "torch"
    if not onednn_linear.applies(device, dtype):
        if spec.onednn_linear:
            why = (
                "this torch build has no oneDNN"
                if not onednn_linear.available()
                else f"it needs float32 on CPU, not {dtype} on {device}"
            )
            raise ModelLoadError(f"onednn_linear=True for {spec.path}: {why}")
        return "torch"
    return "onednn" if onednn_linear.pack_linears(model) else "torch"


def _max_model_len(spec: ModelSpec, config, tokenizer) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit > 10**7:
        limit = None
    if spec.max_model_len is not None:
        if limit is not None and spec.max_model_len > limit:
            raise ModelLoadError(f"max_model_len={spec.max_model_len} exceeds the model's context of {limit} tokens")
        return spec.max_model_len
    if limit is None:
        raise ModelLoadError(f"{spec.path}: the config gives no context length; set ModelSpec.max_model_len")
    return limit


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """EOS ids from generation_config (int or list), else from the tokenizer."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(i) for i in eos)
    return frozenset(ids)
