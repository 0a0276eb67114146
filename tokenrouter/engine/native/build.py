"""The engine's C kernels, compiled for this CPU's level on first use and kept under the store.

A kernel library is a folder of C sources (`gguf/`, `paged_attention/`): the plain C reference,
one file per vector level (`arch/`), and the headers they share (their own, and `level.h`:
the level's macros, shared by every library), compiled together into
`<home>/kernels/<name>-<level>-<key>.so` with the machine's C compiler (`cc -O3 -fopenmp`, the
level's target flags from `cpu.py`: `-march=native` at the CPU's own level, `-march=x86-64-v3`
style flags at a lower pinned one, and `-DTR_LEVEL=<n>`, which picks the files that compute). The
key is made of the sources, the compiler, the flags and the CPU, so a library builds once per
machine kind and level (a few seconds; a new build replaces the old one of its level). Its OpenMP
is the one torch already loaded (the same `libgomp.so.1`), so its threads are torch's.

A compiler without OpenMP (Apple clang; `takes_openmp` asks it once with a tiny compile) builds
the kernels with `-pthread` instead: `parallel.h` splits their rows over POSIX threads the way
OpenMP's static schedule does, so each row's result is the same. `TOKENROUTER_OPENMP=0` (or
`build(..., openmp=False)`) builds that way where OpenMP is there too, in a cache entry of its own
(`<name>-<level>-pthreads-<key>.so`): the tests hold it to the OpenMP build. Where there is no
compiler or the build fails, `load` answers the reason, and the caller keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import re
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
PTHREAD_FLAGS = ["-O3", "-pthread", "-shared", "-fPIC"]  # no OpenMP: parallel.h's POSIX threads
OPENMP_ENV = "TOKENROUTER_OPENMP"  # 0 / off / false / no: build without OpenMP where the compiler has it
HERE = Path(__file__).parent  # the C sources live beside their builder
SHARED = [HERE / "level.h", HERE / "parallel.h"]  # what every library includes: the level's macros, its threads
T = TypeVar("T")

_lock = threading.Lock()
# (sources, home, level, OpenMP) -> what `open_` made of it, or why none
_loaded: dict[tuple[str, str, str, bool], object] = {}


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


def flags(level: cpu.CpuLevel, openmp: bool = True, cc_version: str = "") -> list[str]:
    """The compiler's flags for a library at `level`, with OpenMP or POSIX threads; `cc_version`
    (the compiler's `--version`) picks Apple clang's target flags (cpu.py)."""
    base = BASE_FLAGS if openmp else PTHREAD_FLAGS
    return [*base, *level.compile_flags(cc_version), f"-DTR_LEVEL={level.rank}"]


def openmp_wanted() -> bool:
    """Whether the environment lets the kernels use OpenMP (TOKENROUTER_OPENMP; default yes)."""
    return os.environ.get(OPENMP_ENV, "").strip().lower() not in ("0", "off", "false", "no")


OPENMP_PROBE = """
int tr_openmp_probe(int n, float *x) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) x[i] += 1.0f;
    return n;
}
"""


@functools.lru_cache(maxsize=8)
def takes_openmp(cc: str, cc_version: str = "") -> bool:
    """Whether `cc` builds a shared library with -fopenmp (Apple clang refuses the flag; clang
    without libomp finds no runtime to link): a tiny compile, once per compiler and version."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text(OPENMP_PROBE)
        try:
            done = subprocess.run(
                [cc, "-fopenmp", "-shared", "-fPIC", "-o", str(Path(tmp) / "probe.so"), str(source)],
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0


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
    key = (str(src.folder), str(store.home_dir(home)), level.level, openmp_wanted())
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


def entry(src: Sources, folder: Path, level: cpu.CpuLevel, cc_version: str, openmp: bool) -> Path:
    """Where the build of `src` for this compiler (its `--version`), CPU, level and threads lives:
    `<name>-<level>[-pthreads]-<key>.so`, the key made of all of them."""
    args = flags(level, openmp, cc_version)
    key = {"source": src.text(), "cc": cc_version, "flags": args, "cpu": cpu_identity(), "level": level.level}
    if not openmp:  # the OpenMP build's key is as it always was
        key["openmp"] = False
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = f"{src.name.replace('_', '-')}-{level.level}" + ("" if openmp else "-pthreads")
    return folder / f"{stem}-{digest}.so"


def build(src: Sources, folder: Path, level: cpu.CpuLevel | None = None, openmp: bool | None = None) -> Path:
    """The shared library of `src` for this compiler, CPU and `level` (default: the current one),
    built into `folder` if not there; with OpenMP where the compiler takes it, unless `openmp` is
    False (None: as TOKENROUTER_OPENMP says)."""
    level = level or cpu.current()
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    wanted = openmp_wanted() if openmp is None else openmp
    if wanted and (found := entry(src, folder, level, version, True)).is_file():
        return found  # built with OpenMP before: the compiler takes it, no need to ask
    openmp = wanted and takes_openmp(cc, version)
    path = entry(src, folder, level, version, openmp)
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # built aside, then moved in whole
        out = Path(tmp) / path.name
        command = [cc, *flags(level, openmp, version), f"-I{src.folder}", "-o", str(out), *map(str, src.files())]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-400:]}")
        os.replace(out, path)
    stem = path.name[: -len("-0123456789abcdef.so")]
    same = re.compile(re.escape(stem) + r"-[0-9a-f]{16}\.so")  # this variant's: the other keeps its own
    for old in folder.glob(f"{stem}-*.so"):  # earlier builds (a process still using one keeps its mapping)
        if old != path and same.fullmatch(old.name):
            old.unlink(missing_ok=True)
    threads = "OpenMP" if openmp else "POSIX threads"
    log.info("built the %s kernels for CPU level %s (%s): %s", src.name, level.level, threads, path)
    return path
