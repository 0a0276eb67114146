"""The C kernels' ARM64 levels, checked on any x86 machine: the check drivers in tests/native/ (the
GGUF block kernels, the attention kernel: each compares every level's code with the plain C and
prints a PASS line per check) cross-compiled for aarch64 at each of ARM64's levels and run under
qemu's user-mode emulation, and the same drivers compiled natively at this machine's x86 level and
at plain; each once without OpenMP too (native/parallel.h's POSIX threads, as on a Mac).

- plain (TR_LEVEL 0, -march=armv8-a), neon (3), dotprod (4, armv8.2-a+dotprod) and i8mm (5,
  +i8mm) run on `-cpu max`, which has every feature; neon also on `-cpu cortex-a57`, an ARMv8.0
  core, where a dot-product instruction would stop it with SIGILL;
- each binary is built once, in parallel, into a module's folder (this file's budget: about 45 s
  on 2 cores).

A missing tool (aarch64-linux-gnu-gcc, qemu-aarch64: Debian's gcc-aarch64-linux-gnu and
qemu-user, which scripts/setup.sh installs where it runs as root) or driver skips, saying which.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tokenrouter.engine import native
from tokenrouter.engine.native import cpu

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "tokenrouter" / "engine" / "native"
DRIVERS = {  # each library's check driver
    "gguf": ROOT / "tests" / "native" / "gguf_check.c",
    "paged_attention": ROOT / "tests" / "native" / "attention_check.c",
}
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
THREADS = "2"

# (ARM64 level, OpenMP, qemu's CPU): each level on the emulator's every-feature CPU, NEON also on
# an ARMv8.0 core, the highest level once with POSIX threads
ARM_RUNS = [(level, True, "max") for level in cpu.ARM_LEVELS]
ARM_RUNS += [("neon", True, "cortex-a57"), ("i8mm", False, "max")]
# (x86 level, OpenMP): this machine's own level, and plain C with POSIX threads (every x86 level
# with and without OpenMP is held to the plain reference in process by tests/engine/quant,
# tests/engine/attention and tests/engine/test_kernels_without_openmp.py; the drivers add their
# bit-order checks at the level a machine serves with, and the plain code an ARM64 plain build shares)
X86_RUNS = [(cpu.runnable()[-1], True), ("plain", False)] if cpu.current().x86 else []


def _command(cc: str, lib: str, level_flags: list[str], rank: int, openmp: bool, out: Path, static: bool) -> list[str]:
    folder = NATIVE / lib
    sources = sorted(map(str, [*folder.glob("*.c"), *folder.glob("arch/*.c")]))
    threads = "-fopenmp" if openmp else "-pthread"
    return [
        cc,
        "-O2",
        *(["-static"] if static else []),
        threads,
        f"-DTR_LEVEL={rank}",
        *level_flags,
        f"-I{folder}",
        str(DRIVERS[lib]),
        *sources,
        "-lm",
        "-o",
        str(out),
    ]


def _compile(command: list[str]) -> str:
    """'' when built, else the compiler's complaint."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return "" if done.returncode == 0 else f"{' '.join(command)}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(arch, lib, level, openmp) -> (binary, a future of '' or why it did not build): every binary
    this file runs, compiled in parallel as the tests start."""
    folder = tmp_path_factory.mktemp("arm-emulated")
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
    jobs: dict[tuple, tuple[Path, Future]] = {}
    have_cross = shutil.which(CROSS) is not None
    host_cc = native.compiler()
    for lib, driver in DRIVERS.items():
        if not driver.is_file():
            continue
        for level, openmp, _ in ARM_RUNS if have_cross else []:
            key = ("aarch64", lib, level, openmp)
            if key not in jobs:
                out = folder / "-".join(map(str, key))
                command = _command(CROSS, lib, cpu.ARM_COMPILE[level], cpu.ALL_LEVELS.index(level), openmp, out, True)
                jobs[key] = (out, pool.submit(_compile, command))
        for level, openmp in X86_RUNS if host_cc else []:
            out = folder / f"x86-{lib}-{level}-{openmp}"
            flags = cpu.at(level).compile_flags()
            command = _command(host_cc, lib, flags, cpu.ALL_LEVELS.index(level), openmp, out, False)
            jobs[("x86", lib, level, openmp)] = (out, pool.submit(_compile, command))
    yield jobs
    pool.shutdown(cancel_futures=True)


def _binary(builds, key: tuple) -> Path:
    arch, lib = key[:2]
    if not DRIVERS[lib].is_file():
        pytest.skip(f"{DRIVERS[lib].relative_to(ROOT)} does not exist yet")
    if arch == "aarch64" and shutil.which(CROSS) is None:
        pytest.skip(f"no {CROSS} (Debian: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)")
    if arch == "x86" and native.compiler() is None:
        pytest.skip("no C compiler")
    out, job = builds[key]
    why = job.result()
    assert not why, why
    return out


def _passes(command: list[str]) -> None:
    # OpenMP's threads wait for work by spinning, which under emulation costs ten times the work
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    said = f"{' '.join(command)} exited {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    assert done.returncode == 0, said
    assert lines and all(re.search(r"\bPASS\b", line) for line in lines), said


@pytest.mark.parametrize("lib", list(DRIVERS))
@pytest.mark.parametrize(
    "level, openmp, qemu_cpu",
    ARM_RUNS,
    ids=[f"{lv}-{'openmp' if omp else 'pthreads'}-{c}" for lv, omp, c in ARM_RUNS],
)
def test_each_arm64_level_passes_its_checks_under_emulation(builds, lib, level, openmp, qemu_cpu):
    binary = _binary(builds, ("aarch64", lib, level, openmp))
    if shutil.which(QEMU) is None:
        pytest.skip(f"no {QEMU} (Debian: qemu-user)")
    _passes([QEMU, "-cpu", qemu_cpu, str(binary), THREADS])


@pytest.mark.skipif(not X86_RUNS, reason="not an x86 machine")
@pytest.mark.parametrize("lib", list(DRIVERS))
@pytest.mark.parametrize(
    "level, openmp", X86_RUNS, ids=[f"{lv}-{'openmp' if omp else 'pthreads'}" for lv, omp in X86_RUNS]
)
def test_each_x86_level_passes_the_same_checks(builds, lib, level, openmp):
    _passes([str(_binary(builds, ("x86", lib, level, openmp))), THREADS])
