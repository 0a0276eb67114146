"""Files the package writes for others to read (store models, latency profiles, labels, routers,
evaluation data): whole or not at all, and with the user's usual permissions.

A reader never sees half a file: each is written under a temporary name beside its target and
renamed over it only once complete. Temporary files are made 0600 (mkstemp) and safetensors may
write 0600 too, so a published file gets the mode the umask gives an ordinary file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_mode(path: Path) -> None:
    """The umask-based mode of an ordinary file or directory (not mkstemp's 0600 / mkdtemp's 0700)."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~umask())


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path` for the block to write; renamed over `path`, with the usual
    mode, if the block ends without an error, else removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        publish_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text_atomic(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def rewrite_section(doc: str | Path, begin: str, end: str, section: str) -> bool:
    """Put `section` (its markers included) in place of what lies between the markers `begin`
    and `end` of `doc` (a generated reference in a doc); True if the doc changed."""
    doc = Path(doc)
    text = doc.read_text(encoding="utf-8")
    start, stop = text.index(begin), text.index(end) + len(end)
    new = text[:start] + section + text[stop:]
    if new != text:
        doc.write_text(new, encoding="utf-8")
    return new != text
