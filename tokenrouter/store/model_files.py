"""The files that go with a GGUF: its config, generation config and tokenizer, written once as a
Hugging Face directory without weights.

The engine computes from the GGUF itself (its quantized blocks, and its small float tensors), so
the store keeps the GGUF and only what parsing its metadata would otherwise redo at every load
(the tokenizer's 150,000 tokens and merges take seconds). A dense copy of the weights is written
into the same directory only when a mode computes on dense weights (engine/model/dense_copy.py).

- a store model's files are `<home>/models/<name>/`, written by `ensure_model` at pull;
- any other GGUF's are `<home>/derived/<stem>-<key>/`, the key made of the file's path, size and
  modification time, written by `files_for` on its first load.
Each is written in a temporary directory and renamed into place, `.complete` last.
"""

from __future__ import annotations

import hashlib
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
from .registry import MODELS, source_of


def write_model_files(gguf: Path, out_dir: Path) -> None:
    """Write config.json, generation_config.json and the tokenizer read from a GGUF's metadata."""
    from transformers import AutoConfig, GenerationConfig

    t0 = time.monotonic()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the engine decides how to compute, not the file's loader
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    tokenizer = gguf_tokenizer(gguf, config.model_type)
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and not 0 < getattr(tokenizer, "model_max_length", 0) <= limit:
        tokenizer.model_max_length = limit  # GGUF tokenizers come with no limit (1e30)
    tokenizer.save_pretrained(out_dir)
    drop_keys(out_dir / "tokenizer_config.json", ("local_files_only", "is_local"))  # load-time options, not config
    log(f"read the config and tokenizer of {gguf.name} in {time.monotonic() - t0:.1f} s")


def gguf_tokenizer(gguf: Path, model_type: str):
    """The tokenizer in a GGUF's metadata. Named by its model type where transformers knows it, so
    that it does not parse the whole metadata again to find its class (10 s for the demo 0.5B)."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    kind = model_type if TOKENIZER_MAPPING_NAMES.get(model_type) else None
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, tokenizer_type=kind, local_files_only=True)


def drop_keys(path: Path, keys: Sequence[str]) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if any(k in data for k in keys):
        for k in keys:
            data.pop(k, None)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_model_files(out_dir: Path) -> None:
    """The written files load: a config naming an architecture, and a tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(out_dir, local_files_only=True)
        AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"the config or tokenizer written to {out_dir} does not load: {e}") from e


def publish(gguf: Path, target: Path, marker: str, what: str) -> None:
    """Write `gguf`'s files in a temporary directory beside `target` and rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        log(f"writing the config and tokenizer of {what} to {target}")
        write_model_files(gguf, tmp)
        check_model_files(tmp)
        (tmp / COMPLETE_MARKER).write_text(f"{marker}\n")
        for p in [tmp, *tmp.iterdir()]:
            publish_mode(p)
        if target.exists():  # an incomplete leftover of a crash
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_model(name: str, home: str | Path | None = None) -> Path:
    """The directory of a registered model's files, `<home>/models/<name>/`, made if missing: its
    GGUF fetched and verified (`ensure_gguf`, kept under `<home>/gguf/`), its config and tokenizer
    written beside. A complete directory (its `.complete` marker is written last) is returned at once."""
    source = source_of(name)
    root = home_dir(home)
    target = model_dir(name, root)
    if (target / COMPLETE_MARKER).is_file():
        return target
    gguf = ensure_gguf(name, root)
    with locked(root, name):
        if not (target / COMPLETE_MARKER).is_file():
            publish(gguf, target, source.sha256, f"{name} ({source.description or gguf.name})")
    return target


def store_name(gguf: Path, home: str | Path | None = None) -> str | None:
    """The registered name of a GGUF the store keeps (`<home>/gguf/<name>.gguf`), else None."""
    gguf = Path(gguf).resolve()
    if gguf.parent != (home_dir(home) / "gguf").resolve() or gguf.stem not in MODELS:
        return None
    return gguf.stem


def derived_dir(gguf: Path, home: str | Path | None = None) -> Path:
    """Where the files of a GGUF from outside the store go: keyed by its path, size and mtime, so
    an edited or replaced file gets new ones."""
    gguf = Path(gguf).resolve()
    st = gguf.stat()
    key = json.dumps([str(gguf), st.st_size, st.st_mtime_ns])
    return home_dir(home) / "derived" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def files_for(gguf: Path, home: str | Path | None = None) -> Path:
    """The directory holding a GGUF's config and tokenizer (and its dense copy, once written):
    the store's own directory for a store GGUF, else a derived one, written on first use."""
    name = store_name(gguf, home)
    if name is not None:
        return ensure_model(name, home)
    target = derived_dir(gguf, home)
    if (target / COMPLETE_MARKER).is_file():
        return target
    root = home_dir(home)
    with locked(root, target.name):
        if not (target / COMPLETE_MARKER).is_file():
            publish(Path(gguf), target, str(Path(gguf).resolve()), Path(gguf).name)
    return target
