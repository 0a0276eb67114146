"""Load a decoder-only model and its tokenizer from a local Hugging Face directory or a GGUF file.

Every way of naming a model comes down to one `Checkpoint`: the directory of its config and
tokenizer, the GGUF its weights come from (if any) and where dense weights are (if any). A store
name or directory, a `.gguf` path, a directory holding one, and a Hugging Face directory all go
through `locate_checkpoint`, and the precision rule (`precision.py`) then sees the same thing
whatever the form: on CPU a GGUF-backed model computes from its blocks where the probe says they
win. A GGUF's config and tokenizer are read from its metadata once and kept (`store.files_for`);
its weights are read from the GGUF at each load (`gguf_weights.py`), or, for a mode that computes
on dense weights, from a dense copy written once (`dense_copy.py`).

transformers supplies the model definition, config, tokenizer and chat template; the only thing
the engine changes is the attention function, so that it owns the KV cache. Weights are read one
tensor at a time (`weights.py`), so that loading peaks near the memory the model then holds.
Nothing here ever reaches the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...config import ModelSpec
from ...errors import ModelLoadError
from .. import attention, native
from ..quant import (
    GGUF_MODES,
    GGUFWeights,
    gguf_sourced,
    main_kind,
    meta_model,
    narrow_head,
    prepare_linears,
    resolve_precision,
)
from . import dense_copy
from .shared_tokenizer import load_shared
from .weights import checkpoint_files, load_from_gguf, load_streaming

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
    # what the linear layers run on (engine/quant/kernels.py): "onednn" when packed, "int8+onednn"
    # for a dynamic-int8 drafter, "int4+int8+onednn+gguf-embedding" from a GGUF's blocks, "torch" otherwise
    linear_kernel: str = "torch"
    precision: str = ""  # what it computes in, and why (engine/quant/precision.py)
    kv_dtype: torch.dtype | None = None  # what its KV cache holds (None: `dtype`)

    @property
    def kv(self) -> torch.dtype:
        return self.kv_dtype or self.dtype


@dataclass(frozen=True)
class Checkpoint:
    """Where a model's files are, whatever form named it."""

    files: Path  # config.json and the tokenizer
    gguf: Path | None  # the GGUF its weights come from, if any
    dense: Path | None  # a directory holding its weights dense (safetensors or .bin), if any

    def dense_or_written(self, config) -> Path:
        """The dense weights' directory, the GGUF's dense copy written first where there is none."""
        if self.dense is not None:
            return self.dense
        assert self.gguf is not None, "a checkpoint has a GGUF or dense weights"
        from ... import store

        return dense_copy.write(self.gguf, config, store.files_for(self.gguf)).parent


# A load's leftovers worth a heap trim: trimming collects the whole process's garbage first, 0.2-0.4 s
# in a process holding transformers, which a model of a few MB (a test's) would pay at every load
TRIM_MIN_BYTES = 64 << 20


def weight_bytes(ckpt: Checkpoint) -> int:
    """The size of a checkpoint's weight files (its GGUF, else its dense weights)."""
    if ckpt.gguf is not None:
        return ckpt.gguf.stat().st_size
    if ckpt.dense is None:
        return 0
    return sum(f.stat().st_size for f in ckpt.dense.iterdir() if f.suffix in (".safetensors", ".bin"))


def locate_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint a model path names: a `.gguf` file; a directory holding exactly one `.gguf`
    (with or without a config beside it); a store directory (its GGUF is under the store's `gguf/`);
    or a Hugging Face directory with dense weights. A GGUF without a config beside it gets its
    config and tokenizer from `store.files_for`, read from its metadata once."""
    from ... import store

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file must be a .gguf file or a directory: {path}")
        return _gguf_checkpoint(path)
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").exists():
        if len(ggufs) == 1:
            return _gguf_checkpoint(ggufs[0])
        raise ModelLoadError(f"not a model directory (no config.json, and not exactly one .gguf file): {path}")
    gguf = store.gguf_for(path) or (ggufs[0] if len(ggufs) == 1 else None)
    dense = path if _has_weights(path) else _dense_beside(gguf)
    if gguf is None and dense is None:
        raise ModelLoadError(f"no weights (*.safetensors, or one .gguf file) in model directory: {path}")
    return Checkpoint(path, gguf, dense)


def _gguf_checkpoint(gguf: Path) -> Checkpoint:
    from ... import store

    try:
        files = store.files_for(gguf)
    except OSError as e:
        raise ModelLoadError(f"cannot keep the config and tokenizer read from {gguf}: {e}") from e
    return Checkpoint(files, gguf, files if _has_weights(files) else None)


def _has_weights(directory: Path) -> bool:
    return checkpoint_files(directory) is not None or any(directory.glob("*.bin"))


def _dense_beside(gguf: Path | None) -> Path | None:
    """The dense copy an earlier load wrote for this GGUF from outside the store, if any."""
    from ... import store

    if gguf is None:
        return None
    files = store.derived_dir(gguf)
    return files if files.is_dir() and _has_weights(files) else None


def load_tokenizer(spec: ModelSpec):
    """The model's tokenizer; models with the same tokenizer files share one (`shared_tokenizer.py`)."""
    from transformers import AutoTokenizer

    where = Path(spec.tokenizer) if spec.tokenizer is not None else locate_checkpoint(Path(spec.path)).files
    try:
        return load_shared(where, lambda: AutoTokenizer.from_pretrained(where, local_files_only=True))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load a tokenizer for {spec.path}: {e}") from e


def load_model(name: str, spec: ModelSpec, threads: int | None = None) -> LoadedModel:
    """The model, in the precision this machine computes it fastest in (`precision.py`), with its
    linear layers on their kernels (`quant/kernels.py`). `threads`: what its forwards will run on
    (the precision probe times with as many)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    attention.register()
    ckpt = locate_checkpoint(Path(spec.path))
    try:
        config = AutoConfig.from_pretrained(ckpt.files, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the model config of {spec.path}: {e}") from e
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{spec.path}: encoder-decoder models are not supported, only decoder-only ones")
    device = _usable_device(spec)
    if spec.quantization in GGUF_MODES and ckpt.gguf is None:  # asked for: must exist on every machine
        raise ModelLoadError(
            f"quantization={spec.quantization!r} for {spec.path}: no GGUF file for it (a .gguf path, a store "
            "model, or a directory holding one .gguf beside its config)"
        )
    gguf_kind = main_kind(ckpt.gguf) if ckpt.gguf is not None else None
    precision = resolve_precision(spec, config, device, threads, gguf_kind)
    dtype = precision.dtype
    gguf = GGUFWeights(ckpt.gguf, config) if precision.quantization in GGUF_MODES else None
    try:
        if gguf is not None:  # what the GGUF's blocks supply stays on meta, for the kernels to fill
            skip = gguf_sourced(meta_model(config), gguf, precision.gguf_blocks)
            if ckpt.dense is not None and precision.quantization == "gguf+bf16":
                skip = set()  # the dense copies of the weights serve the bf16 kernels (dense_bf16)
            streamed = load_streaming(config, ckpt.dense, dtype, ATTN, skip) if ckpt.dense else None
            model = streamed or load_from_gguf(config, gguf, ckpt.files, dtype, ATTN, skip)
        else:
            dense = ckpt.dense_or_written(config)
            model = load_streaming(config, dense, dtype, ATTN) or AutoModelForCausalLM.from_pretrained(
                dense, dtype=dtype, attn_implementation=ATTN, local_files_only=True
            )
        _check_attention(spec, model)
        if gguf is None:  # GGUF-sourced weights are still on meta, filled next (on CPU, where they go)
            model.to(device)
        model.eval()
        vocab_size = model.get_output_embeddings().weight.shape[0]
        linear_kernel = prepare_linears(model, spec, precision, device, gguf)
    except ValueError as e:
        raise ModelLoadError(f"{spec.path}: transformers cannot build a causal LM from it: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load the weights of {spec.path}: {e}") from e
    finally:
        if gguf is not None:
            gguf.close()
        if weight_bytes(ckpt) >= TRIM_MIN_BYTES:  # what loading freed goes back: the steady size is the model's
            native.trim_heap()
    if spec.draft_vocab is not None:
        if spec.draft_vocab >= vocab_size:
            raise ModelLoadError(
                f"draft_vocab={spec.draft_vocab} must be below {spec.path}'s vocabulary of {vocab_size}"
            )
        if not narrow_head(model, spec.draft_vocab):
            linear_kernel += f"+head-first-{spec.draft_vocab}"
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


def dense_checkpoint(path: Path) -> Path:
    """A Hugging Face directory with the model's dense weights, for code that loads it with
    transformers itself (labelling, reference baselines): a GGUF's dense copy, written once."""
    from transformers import AutoConfig

    ckpt = locate_checkpoint(Path(path))
    if ckpt.dense is not None:
        return ckpt.dense
    return ckpt.dense_or_written(AutoConfig.from_pretrained(ckpt.files, local_files_only=True))


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
