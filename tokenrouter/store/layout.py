"""Where the store keeps things under its home directory, and the guards every write goes
through: a lock per model between processes, and progress shown on a terminal.

Layout under the home directory ($TOKENROUTER_HOME, else $XDG_CACHE_HOME/tokenrouter, else
~/.cache/tokenrouter)::

    gguf/<name>.gguf        the verified GGUF file
    models/<name>/          its config and tokenizer (and dense copy, once a mode needed it);
                            `.complete` is written last
    derived/<stem>-<key>/   the same for a GGUF from outside the store, on its first load
    kernels/, probes/       built kernels and timed probes (engine/quant/)

Every step writes to a temporary name and renames into place at the end, so an interrupted run
never leaves a file or directory that looks whole.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

COMPLETE_MARKER = ".complete"


def home_dir(home: str | Path | None = None) -> Path:
    """The store's root: `home` if given, else $TOKENROUTER_HOME, else $XDG_CACHE_HOME/tokenrouter,
    else ~/.cache/tokenrouter."""
    if home is not None:
        return Path(os.path.expanduser(str(home)))
    env = os.environ.get("TOKENROUTER_HOME")
    if env:
        return Path(os.path.expanduser(env))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expanduser(cache)) / "tokenrouter"


def gguf_path(name: str, home: str | Path | None = None) -> Path:
    return home_dir(home) / "gguf" / f"{name}.gguf"


def model_dir(name: str, home: str | Path | None = None) -> Path:
    return home_dir(home) / "models" / name


def log(msg: str) -> None:
    print(f"[tokenrouter.store] {msg}", file=sys.stderr, flush=True)


def progress(**kwargs):
    """A progress bar on stderr, shown only on a terminal (the `log` lines say the same in logs)."""
    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, disable=None, leave=False, **kwargs)


@contextlib.contextmanager
def locked(home: Path, name: str) -> Iterator[None]:
    """An exclusive inter-process lock per model, so two processes never fetch the same model at once.

    Without fcntl (not POSIX) there is no lock; the temporary names still keep every write atomic.
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None
    locks = home / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
