"""The engine's C kernels, compiled for this CPU on first use and kept under the store.

A kernel file `<name>.c` is built with the machine's C compiler (`cc -O3 -march=native -fopenmp`)
into `<home>/kernels/<name>-<key>.so`, the key made of the source, the compiler, the flags and the
CPU, so that it builds once per machine kind (about a second; a new build replaces the old). Its
OpenMP is the one torch already loaded (the same `libgomp.so.1`), so its threads are torch's.
Where there is no compiler or the build fails, `load` answers the reason, and the caller keeps
torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
SOURCES = Path(__file__).parent  # the C sources live beside their builder
T = TypeVar("T")

_lock = threading.Lock()
_loaded: dict[tuple[str, str], object] = {}  # (source, home) -> what `open_` made of the library, or why none


def source(name: str) -> Path:
    """The path of one of the engine's C sources (`gguf_kernels.c`, `paged_kernels.c`)."""
    path = SOURCES / name
    if not path.is_file():
        raise FileNotFoundError(f"no C source {name!r} in {SOURCES}")
    return path


def cpu_identity() -> dict:
    """The CPU's model name and flags, from the first processor in /proc/cpuinfo where there is one."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep and fields:
                    break  # the end of the first processor's block
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = fields.get("flags") or fields.get("Features") or ""
    name = fields.get("model name") or platform.processor() or platform.machine()
    return {"cpu": name, "flags": sorted(flags.split()), "machine": platform.machine()}


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def load(source: Path, open_: Callable[[ctypes.CDLL, Path], T], home: str | Path | None = None) -> tuple[T | None, str]:
    """(open_(the library, its path), "") or (None, why not): built on first use, then read from
    the store; once per process for each source and store."""
    from ... import store

    key = (str(source), str(store.home_dir(home)))
    with _lock:
        if key not in _loaded:
            try:
                path = build(source, store.home_dir(home) / "kernels")
                _loaded[key] = open_(ctypes.CDLL(str(path)), path)
            except (OSError, subprocess.SubprocessError, RuntimeError) as e:
                _loaded[key] = f"{source.stem} did not build: {e}"
                log.warning("%s; torch's kernels serve instead", _loaded[key])
        got = _loaded[key]
    return (None, got) if isinstance(got, str) else (got, "")  # type: ignore[return-value]


def build(source: Path, folder: Path) -> Path:
    """The shared library of `source` for this compiler and CPU, built into `folder` if not there."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = {"source": source.read_text(), "cc": version, "flags": FLAGS, "cpu": cpu_identity()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = source.stem.replace("_", "-")
    path = folder / f"{stem}-{digest}.so"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # built aside, then moved in whole
        out = Path(tmp) / path.name
        done = subprocess.run([cc, *FLAGS, "-o", str(out), str(source)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-400:]}")
        os.replace(out, path)
    for old in folder.glob(f"{stem}-*.so"):  # earlier builds (a process still using one keeps its mapping)
        if old != path:
            old.unlink(missing_ok=True)
    log.info("built %s for this CPU: %s", source.name, path)
    return path
