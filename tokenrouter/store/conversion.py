"""Converting a verified GGUF once into an ordinary Hugging Face directory (bf16 safetensors,
config, generation config, tokenizer), which loads in seconds where the GGUF takes tens of
seconds to dequantize. Written in a temporary directory and renamed into place, checked first."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelLoadError
from ..files import publish_mode
from .downloads import ensure_gguf
from .layout import COMPLETE_MARKER, home_dir, locked, log, model_dir
from .registry import source_of


def unique_state_dict(model) -> dict:
    """The state dict without tied duplicates (an output head sharing the embedding's storage).

    Names that the model declares as tied copies are dropped in favour of their source; any
    other shared storage keeps its first name.
    """
    tied = getattr(model, "_tied_weights_keys", None) or ()
    tied = set(tied.keys() if isinstance(tied, dict) else tied)
    state = model.state_dict()
    order = [k for k in state if k not in tied] + [k for k in state if k in tied]
    out: dict = {}
    seen: set[tuple] = set()
    for k in order:
        t = state[k]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen:
            continue
        seen.add(key)
        out[k] = t
    return {k: out[k] for k in state if k in out}


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Write a Hugging Face directory (bf16 safetensors, config, generation config, tokenizer) from a GGUF file."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    log(f"loading {gguf.name} (dequantizing; this takes a while)")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, local_files_only=True
    )
    log(f"loaded {type(model).__name__} in {time.monotonic() - t0:.1f} s; writing bf16 safetensors")
    # save_pretrained refuses GGUF-loaded models: write the tensors, config and generation config ourselves.
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in unique_state_dict(model).items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    del tensors
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain bf16 now, not GGUF-quantized
    config.dtype = torch.bfloat16
    config.architectures = [type(model).__name__]
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    del model
    t1 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and not 0 < getattr(tokenizer, "model_max_length", 0) <= limit:
        tokenizer.model_max_length = limit  # GGUF tokenizers come with no limit (1e30)
    tokenizer.save_pretrained(out_dir)
    drop_keys(out_dir / "tokenizer_config.json", ("local_files_only", "is_local"))  # load-time options, not config
    log(f"saved the tokenizer in {time.monotonic() - t1:.1f} s")


def drop_keys(path: Path, keys: Sequence[str]) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if any(k in data for k in keys):
        for k in keys:
            data.pop(k, None)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_converted(out_dir: Path) -> None:
    """Load the converted directory once: every weight must be present, none left over."""
    import torch
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.bfloat16, local_files_only=True, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ModelLoadError(f"the converted model in {out_dir} does not load cleanly: {bad}")


def ensure_model(name: str, home: str | Path | None = None) -> Path:
    """The Hugging Face directory of a registered model, `<home>/models/<name>/`, built if missing.

    A complete directory (its `.complete` marker is written last) is returned at once. Otherwise
    the GGUF is fetched and verified (`ensure_gguf`), converted in a temporary directory beside
    the target, and renamed into place.
    """
    source = source_of(name)
    root = home_dir(home)
    target = model_dir(name, root)
    if (target / COMPLETE_MARKER).is_file():
        return target
    gguf = ensure_gguf(name, root)
    with locked(root, name):
        if (target / COMPLETE_MARKER).is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
        try:
            t0 = time.monotonic()
            log(f"converting {name} ({source.description or gguf.name}) to {target}")
            convert_gguf(gguf, tmp)
            check_converted(tmp)
            (tmp / COMPLETE_MARKER).write_text(f"{source.sha256}\n")
            for p in [tmp, *tmp.iterdir()]:
                publish_mode(p)
            if target.exists():  # an incomplete leftover of an older layout or a crash
                shutil.rmtree(target)
            os.replace(tmp, target)
            log(f"converted {name} in {time.monotonic() - t0:.1f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
