"""One tokenizer for the models of a process whose tokenizer files are the same.

Token-level routing needs one vocabulary, so every model of a routed engine loads the same
tokenizer: 0.1 GB each for the demo pair's (Qwen2.5's BPE of 151,646 tokens), held once per
model. Models whose tokenizer files are byte for byte the same share the first one loaded: a
shallow copy of it shares its vocabulary and its backend (which nothing here changes) and
carries the model's own chat template, since that file may differ where the vocabulary does not
(the demo pair's templates differ in their tools text).

Shared only where that is exact: a fast tokenizer (`tokenizer.json`) whose chat template, if it
has a file of its own, is `chat_template.jinja` (other template files are left to transformers).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TEMPLATE_FILE = "chat_template.jinja"
# what defines the tokenizer besides its chat template file
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
OTHER_TEMPLATES = ("chat_template.json", "additional_chat_templates")

_loaded: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def tokenizer_key(directory: Path) -> str | None:
    """A digest of the files that make the tokenizer of `directory`, its chat template's content
    left out (but not whether it has one); None where sharing would not be exact."""
    if not (directory / "tokenizer.json").is_file() or any((directory / n).exists() for n in OTHER_TEMPLATES):
        return None
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = directory / name
        if path.is_file():
            h.update(f"{name}:{path.stat().st_size}:".encode())
            h.update(path.read_bytes())
    h.update(f"template:{(directory / TEMPLATE_FILE).is_file()}".encode())
    config = directory / "config.json"  # transformers picks the tokenizer class from it where the
    if config.is_file():  # tokenizer's own config does not say
        h.update(str(json.loads(config.read_text(encoding="utf-8")).get("model_type")).encode())
    return h.hexdigest()


def load_shared(directory: Path, load: Callable[[], T]) -> T:
    """`load()`'s tokenizer for `directory`, or a copy of one already loaded from the same files
    (with this directory's chat template)."""
    key = tokenizer_key(directory)
    if key is None:
        return load()
    with _locks_lock:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:  # models loading at once in their worker threads: the second waits and shares
        first = _loaded.get(key)
        if first is None:
            tokenizer = load()
            _loaded[key] = tokenizer
            return tokenizer
    tokenizer = copy.copy(first)
    template = directory / TEMPLATE_FILE
    if template.is_file():  # else both take theirs from the same tokenizer_config.json
        tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer
