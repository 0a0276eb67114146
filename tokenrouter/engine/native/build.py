"""The engine's C kernels, compiled for this CPU's level on first use and kept under the store.

A kernel library is a folder of C sources (`gguf/`, `paged_attention/`): the plain C reference,
one file per vector level (`arch/`), and the headers they share (their own, and `level.h`:
the level's macros, shared by every library), compiled together into
`<home>/kernels/<name>-<level>-<key>.so` with the machine's C compiler (`cc -O3 -fopenmp`, the
level's target flags from `cpu.py`: `-march=native` at the CPU's own level, `-march=x86-64-v3`
style flags at a lower pinned one, and `-DTR_LEVEL=<n>`, which picks the files that compute). The
key is made of the sources, the compiler, the flags and the CPU, so a library builds once per
machine kind and level (a few seconds; a new build replaces the old one of its level). Its OpenMP
is the one torch already loaded (the same `libgomp.so.1`), so its threads are torch's. Where there
is no compiler or the build fails, `load` answers the reason, and the caller keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from . import cpu

log = logging.getLogger(__name__)

BASE_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
HERE = Path(__file__).parent  # the C sources live beside their builder
SHARED = [HERE / "level.h"]  # what every library includes: the level's macros
T = TypeVar("T")

_lock = threading.Lock()
_loaded: dict[tuple[str, str, str], object] = {}  # (sources, home, level) -> what `open_` made of it, or why none


@dataclass(frozen=True)
class Sources:
    """One kernel library's C sources: the folder's .c files (its `arch/` ones too), built as one."""

    name: str  # the folder's name: "gguf", "paged_attention"
    folder: Path

    def files(self) -> list[Path]:
        return sorted(self.folder.rglob("*.c"))

    def text(self) -> str:
        """Every source and header, named: what the build's key is made of."""
        paths = sorted([*self.folder.rglob("*.c"), *self.folder.rglob("*.h")])
        return "".join(f"// {p.relative_to(self.folder.parent)}\n{p.read_text()}" for p in [*SHARED, *paths])


def sources(name: str) -> Sources:
    """One of the engine's kernel libraries (`gguf`, `paged_attention`) by its folder."""
    folder = HERE / name
    if not folder.is_dir() or not any(folder.glob("*.c")):
        raise FileNotFoundError(f"no C sources {name!r} in {HERE}")
    return Sources(name, folder)


def flags(level: cpu.CpuLevel) -> list[str]:
    """The compiler's flags for a library at `level`."""
    return [*BASE_FLAGS, *level.compile_flags(), f"-DTR_LEVEL={level.rank}"]


def cpu_identity() -> dict:
    """The CPU's model name, its flags as the engine may use them, and its level (cpu.py)."""
    level = cpu.current()
    return {"cpu": level.name, "flags": sorted(level.flags), "machine": level.arch, "cpu_level": level.level}


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def load(src: Sources, open_: Callable[[ctypes.CDLL, Path], T], home: str | Path | None = None) -> tuple[T | None, str]:
    """(open_(the library, its path), "") or (None, why not): built for this CPU's level on first
    use, then read from the store; once per process for each library, store and level."""
    from ... import store

    level = cpu.current()
    key = (str(src.folder), str(store.home_dir(home)), level.level)
    with _lock:
        if key not in _loaded:
            try:
                path = build(src, store.home_dir(home) / "kernels", level)
                _loaded[key] = open_(ctypes.CDLL(str(path)), path)
            except (OSError, subprocess.SubprocessError, RuntimeError) as e:
                _loaded[key] = f"{src.name} kernels did not build for CPU level {level.level}: {e}"
                log.warning("%s; torch's kernels serve instead", _loaded[key])
        got = _loaded[key]
    return (None, got) if isinstance(got, str) else (got, "")  # type: ignore[return-value]


def build(src: Sources, folder: Path, level: cpu.CpuLevel | None = None) -> Path:
    """The shared library of `src` for this compiler, CPU and `level` (default: the current one),
    built into `folder` if not there."""
    level = level or cpu.current()
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    args = flags(level)
    key = {"source": src.text(), "cc": version, "flags": args, "cpu": cpu_identity(), "level": level.level}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = f"{src.name.replace('_', '-')}-{level.level}"
    path = folder / f"{stem}-{digest}.so"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # built aside, then moved in whole
        out = Path(tmp) / path.name
        command = [cc, *args, f"-I{src.folder}", "-o", str(out), *map(str, src.files())]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-400:]}")
        os.replace(out, path)
    for old in folder.glob(f"{stem}-*.so"):  # earlier builds (a process still using one keeps its mapping)
        if old != path:
            old.unlink(missing_ok=True)
    log.info("built the %s kernels for CPU level %s: %s", src.name, level.level, path)
    return path
