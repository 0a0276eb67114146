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
from . import heap
from .gguf_weights import GGUFWeights
from .linear import kernels
from .precision import meta_model, resolve_precision
from .shared_tokenizer import load_shared
from .weights import load_streaming

ATTN = attention.ATTN_IMPLEMENTATION


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
    # what the linear layers run on (engine/model/linear/kernels.py): "onednn" when packed, "int8+onednn"
    # for a dynamic-int8 drafter, "int4+int8+onednn+gguf-embedding" from a GGUF's blocks, "torch" otherwise
    linear_kernel: str = "torch"
    precision: str = ""  # what it computes in, and why (engine/model/precision.py)
    kv_dtype: torch.dtype | None = None  # what its KV cache holds (None: `dtype`)

    @property
    def kv(self) -> torch.dtype:
        return self.kv_dtype or self.dtype


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
    """The model's tokenizer; models with the same tokenizer files share one (`shared_tokenizer.py`)."""
    from transformers import AutoTokenizer

    directory, gguf = locate_checkpoint(Path(spec.path))
    try:
        if spec.tokenizer is not None:
            where = Path(spec.tokenizer)
            return load_shared(where, lambda: AutoTokenizer.from_pretrained(where, local_files_only=True))
        if gguf is not None:  # read from the GGUF's metadata
            return AutoTokenizer.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
        return load_shared(directory, lambda: AutoTokenizer.from_pretrained(directory, local_files_only=True))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load a tokenizer for {spec.path}: {e}") from e


def load_model(name: str, spec: ModelSpec, threads: int | None = None) -> LoadedModel:
    """The model, in the precision this machine computes it fastest in (`precision.py`), with its
    linear layers on their kernels (`linear/kernels.py`). `threads`: what its forwards will run on
    (the precision probe times with as many)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    attention.register()
    directory, gguf_file = locate_checkpoint(Path(spec.path))
    try:
        config = AutoConfig.from_pretrained(directory, gguf_file=gguf_file, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the model config of {spec.path}: {e}") from e
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{spec.path}: encoder-decoder models are not supported, only decoder-only ones")
    device = _usable_device(spec)
    # a GGUF asked for must exist on every machine, also where the mode falls back to float32
    gguf_path = _gguf_path(spec, directory, gguf_file) if spec.quantization in ("gguf", "gguf+bf16") else None
    precision = resolve_precision(spec, config, device, threads)
    dtype = precision.dtype
    gguf = GGUFWeights(gguf_path, config) if precision.quantization in ("gguf", "gguf+bf16") else None
    try:
        # "gguf" never reads the dense copies of what the GGUF supplies; "gguf+bf16" keeps them
        skip = kernels.gguf_sourced(meta_model(config), gguf) if precision.quantization == "gguf" else set()
        streamed = None if gguf_file is not None else load_streaming(config, directory, dtype, ATTN, skip)
        model = streamed or AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=gguf_file, dtype=dtype, attn_implementation=ATTN, local_files_only=True
        )
        _check_attention(spec, model)
        if gguf is None:  # GGUF-sourced weights are still on meta, filled next (on CPU, where they go)
            model.to(device)
        model.eval()
        vocab_size = model.get_output_embeddings().weight.shape[0]
        linear_kernel = kernels.prepare_linears(model, spec, precision, device, gguf)
    except ValueError as e:
        raise ModelLoadError(f"{spec.path}: transformers cannot build a causal LM from it: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load the weights of {spec.path}: {e}") from e
    finally:
        if gguf is not None:
            gguf.close()
        heap.trim()  # what loading freed goes back to the system: the steady size is what the model holds
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
        precision=precision.describe(),
        kv_dtype=precision.kv,
    )


def _gguf_path(spec: ModelSpec, directory: Path, gguf_file: str | None) -> Path:
    """The GGUF the weights come from: the model path itself, the store's own copy of the
    checkpoint a converted directory was made from, or the one GGUF file beside its config."""
    from ... import store

    beside = sorted(directory.glob("*.gguf"))
    path = directory / gguf_file if gguf_file is not None else store.gguf_for(directory)
    if path is None and len(beside) == 1:
        path = beside[0]
    if path is None:
        raise ModelLoadError(
            f"quantization='gguf' for {spec.path}: no GGUF file for it (a .gguf path, a store model, or a "
            "directory holding one .gguf beside its config)"
        )
    return path


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
