"""What this CPU offers the engine, in one place: its vector level, and whether torch's bf16 ops run.

Every choice that depends on the CPU reads `current()`: the flags the C kernels are built with
(`build.py`), which GGUF block kernels and attention loops serve, and whether the precision probe
may time bfloat16 at all. The x86 levels, lowest first:

- `plain`: any x86-64 CPU; the kernels' plain C (what the compiler vectorizes on its own);
- `avx2`: AVX2, FMA and F16C (AMD Zen 1-3, Intel from Haswell, AVX512 CPUs without VNNI such as
  Skylake-SP): 256-bit integer dot products (maddubs, madd) and float loops;
- `avx512`: AVX512 F, BW, VL, DQ and VNNI (Intel from Ice Lake, AMD Zen 4 and later): vpdpbusd.

ARM64's levels (Linux's /proc/cpuinfo `Features`, or macOS's `sysctl hw.optional`), lowest first:

- `plain`: the kernels' plain C, as on x86 (the compiler vectorizes it with NEON on its own);
- `neon`: Advanced SIMD (`asimd`), which every ARM64 CPU has: the kernels' NEON code;
- `dotprod`: ARMv8.2's dot product (`asimddp`: Graviton 2 and later, Apple M1 and later): sdot;
- `i8mm`: ARMv8.6's int8 matrix multiply with dotprod (`i8mm`: Graviton 3 and 4, Apple M2 and
  later): smmla.

Any other CPU is at `plain`. Each architecture keeps its own ladder (`levels(arch)`; `LEVELS` is
this machine's); the number a kernel library reports (`tr_level()`) is level.h's, one across both
(`ALL_LEVELS`). Whether torch's oneDNN bf16 linear runs is a separate question with torch's own
answer: it raises unless the CPU has avx512bw, avx512vl and avx512dq, or avx_ne_convert
(`torch_bf16`); it is fast only with avx512_bf16 or amx_bf16.

`TOKENROUTER_CPU_LEVEL=plain|avx2|avx512` (ARM64: `plain|neon|dotprod|i8mm`) pins the level lower
than the machine's (never higher: a higher pin, or another architecture's level, is ignored, and
said): the kernels are built for it (`-march=x86-64-v3` or `-march=armv8.2-a+dotprod` style flags,
in their own cache entry), and every flag above it counts as absent, torch's bf16 ops included.
Where torch has not yet chosen its own kernels, the pin reaches torch too (`ATEN_CPU_CAPABILITY`
and `ONEDNN_MAX_CPU_ISA`, unless set): tests, benchmarks and CI run an AVX512 machine as an AVX2
or a plain one with it.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ENV = "TOKENROUTER_CPU_LEVEL"
X86_LEVELS = ("plain", "avx2", "avx512")  # lowest first
ARM_LEVELS = ("plain", "neon", "dotprod", "i8mm")
ALL_LEVELS = ("plain", "avx2", "avx512", "neon", "dotprod", "i8mm")  # level.h's numbers: TR_LEVEL is the index
X86_ARCHS = ("x86_64", "AMD64", "amd64", "i686", "i386")
ARM_ARCHS = ("aarch64", "arm64", "ARM64")  # Linux, macOS, Windows
NEEDS = {  # the /proc/cpuinfo flags each x86 level needs
    "plain": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "avx512": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}),
}
# flags a CPU at each level cannot be counted on to have: what a pin to that level hides
ABOVE = {
    "plain": ("avx", "fma", "f16c", "amx"),
    "avx2": ("avx512", "amx", "avx_ne_convert", "avx_vnni"),
    "avx512": (),
}
COMPILE = {  # compiler flags for a level pinned below the machine's (its own level builds -march=native)
    "plain": ["-march=x86-64", "-mtune=native"],
    "avx2": ["-march=x86-64-v3", "-mtune=native"],
    "avx512": ["-march=x86-64-v4", "-mavx512vnni", "-mtune=native"],
}
TORCH_ENV = {  # what a pin tells torch: ATen's dispatch level and oneDNN's highest ISA
    "plain": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {},
}
TORCH_BF16 = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}))  # either set
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})

ARM_NEEDS = {  # the /proc/cpuinfo Features each ARM64 level needs (macOS's sysctl spelled alike)
    "plain": frozenset(),
    "neon": frozenset({"asimd"}),
    "dotprod": frozenset({"asimd", "asimddp"}),
    "i8mm": frozenset({"asimd", "asimddp", "i8mm"}),
}
_ARM_LATER = ("sve", "sme", "bf16", "i8mm")  # ARMv8.6-and-later features: no level below i8mm counts on them
ARM_ABOVE = {  # plain keeps asimd: every ARM64 CPU has it, as every x86-64 one has SSE2
    "plain": ("asimddp", *_ARM_LATER),
    "neon": ("asimddp", *_ARM_LATER),
    "dotprod": _ARM_LATER,
    "i8mm": (),
}
# A pinned ARM64 level names its features alone: the builds test exactly the level's code. No
# -mtune: clang on AArch64 took it only lately, and a pinned build is for testing, not speed.
ARM_COMPILE = {
    "plain": ["-march=armv8-a"],
    "neon": ["-march=armv8-a"],
    "dotprod": ["-march=armv8.2-a+dotprod"],
    "i8mm": ["-march=armv8.2-a+dotprod+i8mm"],
}
# Apple clang at the Mac's own level: its -mcpu=native (and -mcpu=apple-m2, -m3, ...) depend on
# the Xcode version (older ones know no Apple core by the host, or not the newer names, and fall
# back to plain ARMv8.0, which level.h then refuses for dotprod), while -march with the level's
# extensions means the same to every version: armv8.4-a is what M1 and later implement in full.
APPLE_CLANG_COMPILE = {
    "plain": ["-march=armv8-a"],
    "neon": ["-march=armv8-a"],
    "dotprod": ["-march=armv8.4-a+dotprod"],
    "i8mm": ["-march=armv8.4-a+dotprod+i8mm"],
}
# macOS's sysctl names for what Linux's Features line says (hw.optional.neon: older macOS's name)
DARWIN_ARM = {
    "hw.optional.AdvSIMD": "asimd",
    "hw.optional.neon": "asimd",
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
}


def levels(arch: str) -> tuple[str, ...]:
    """An architecture's ladder of levels, lowest first (any other than ARM64 has x86's names)."""
    return ARM_LEVELS if arch in ARM_ARCHS else X86_LEVELS


LEVELS = levels(platform.machine())  # this machine's ladder


@dataclass(frozen=True)
class CpuLevel:
    """This CPU as the engine sees it: at `level`, with the flags that level lets it use."""

    arch: str  # platform.machine(): x86_64, aarch64, arm64, ...
    name: str  # the CPU's model name
    flags: frozenset[str] = field(repr=False)  # the CPU's flags, less those above a pinned level (pinned only)
    level: str = "plain"  # what the kernels are built for and chosen at: one of LEVELS
    offered: str = "plain"  # the CPU's own level
    pin: str | None = None  # TOKENROUTER_CPU_LEVEL as given (None: not set)

    @property
    def x86(self) -> bool:
        return self.arch in X86_ARCHS

    @property
    def arm(self) -> bool:
        return self.arch in ARM_ARCHS

    @property
    def pinned(self) -> bool:
        """Whether a pin holds the level below the CPU's own."""
        return self.level != self.offered

    @property
    def rank(self) -> int:
        """The level's number in level.h (TR_LEVEL), one across architectures."""
        return ALL_LEVELS.index(self.level)

    @property
    def torch_bf16(self) -> str | None:
        """Why torch's oneDNN bf16 linear would raise here (None: it runs; whether fast is the probe's
        question). torch requires avx512bw, avx512vl and avx512dq, or avx_ne_convert."""
        if not self.x86 or any(need <= self.flags for need in TORCH_BF16):
            return None
        where = f"at CPU level {self.level}" if self.pinned else "on this CPU"
        return f"torch's bf16 linear needs avx512bw, avx512vl and avx512dq, or avx_ne_convert: not {where}"

    @property
    def native_bf16(self) -> bool:
        """Whether the CPU computes bf16 natively (avx512_bf16 or amx_bf16, at this level)."""
        return bool(NATIVE_BF16 & self.flags)

    def compile_flags(self, cc_version: str = "") -> list[str]:
        """The C kernels' target flags: the machine's own where it runs at its own level, else the
        level's. `cc_version` is the compiler's `--version` text: Apple clang gets the level's
        -march at the Mac's own level too (APPLE_CLANG_COMPILE says why)."""
        if self.arm:
            if self.pinned:
                return list(ARM_COMPILE[self.level])
            if "Apple clang" in cc_version:
                return list(APPLE_CLANG_COMPILE[self.level])
            return ["-mcpu=native"]  # gcc and clang on ARM64 take the host's CPU by -mcpu, not -march
        if self.pinned and self.x86:
            return list(COMPILE[self.level])
        return ["-march=native"]

    def describe(self) -> str:
        """One line: the level, and why where a pin or torch sets it."""
        if self.pinned:
            return f"{self.level} ({ENV}={self.pin}; this CPU offers {self.offered})"
        why = "above it" if self.pin in levels(self.arch) else f"not a level of {self.arch}"
        ignored = f"; {ENV}={self.pin} is {why} and ignored" if self.pin and self.pin != self.level else ""
        return f"{self.level}{ignored}"

    def record(self) -> dict:
        """What a benchmark's machine record and a probe's key hold of the CPU."""
        return {"cpu": self.name, "machine": self.arch, "cpu_level": self.level, "cpu_offers": self.offered}


def current() -> CpuLevel:
    """This CPU at the level the environment allows (read anew each call: tests and benchmarks pin
    it); a pin that is not a level raises ValueError naming the variable."""
    arch, name, flags = _identity()
    offered, ladder = offered_level(arch, flags), levels(arch)
    pin = os.environ.get(ENV, "").strip().lower() or None
    if pin is not None and pin not in ALL_LEVELS:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: must be one of {', '.join(ladder)}")
    level = offered
    if pin is not None and pin not in ladder:  # a script's pin for another architecture's CPUs
        _warn_once(f"{ENV}={pin} is not a level of {arch} ({', '.join(ladder)}): the kernels stay at {offered}")
    elif pin is not None and ladder.index(pin) < ladder.index(offered):
        level = pin
    elif pin is not None and pin != offered:
        _warn_once(f"{ENV}={pin} is above what this CPU offers ({offered}): the kernels stay at {offered}")
    return CpuLevel(arch, name, visible(flags, level, arch) if level != offered else flags, level, offered, pin)


def at(level: str) -> CpuLevel:
    """This CPU as if pinned to `level` (tests and benchmarks build each level the machine can
    run); ValueError for a level it cannot run."""
    here = current()
    if level not in runnable():
        raise ValueError(f"CPU level {level!r}: this CPU runs {', '.join(runnable())}")
    arch, _, flags = _identity()
    return CpuLevel(arch, here.name, visible(flags, level, arch), level, here.offered, level)


def runnable() -> list[str]:
    """The levels this CPU can run, lowest first: its own and every one below."""
    arch, _, flags = _identity()
    ladder = levels(arch)
    return list(ladder[: ladder.index(offered_level(arch, flags)) + 1])


def offered_level(arch: str, flags: frozenset[str]) -> str:
    """The highest level whose flags the CPU has (plain off x86-64 and ARM64)."""
    if arch in ARM_ARCHS:
        return next(level for level in reversed(ARM_LEVELS) if ARM_NEEDS[level] <= flags)
    if arch not in ("x86_64", "AMD64", "amd64"):
        return "plain"
    return next(level for level in reversed(X86_LEVELS) if NEEDS[level] <= flags)


def visible(flags: frozenset[str], level: str, arch: str = "x86_64") -> frozenset[str]:
    """The flags a CPU of `arch` at `level` lets the engine use: those above it hidden."""
    hidden = ARM_ABOVE[level] if arch in ARM_ARCHS else ABOVE[level]
    return frozenset(f for f in flags if not f.startswith(hidden))


def pin_torch() -> list[str]:
    """Tell torch the pinned level (ATen's dispatch, oneDNN's ISA) where the environment does not
    already; returns the variables set. It counts only before torch first picks its kernels: it is
    called when tokenrouter's native code is imported."""
    try:
        level = current()
    except ValueError:
        return []  # the engine's first use reports the bad pin
    if not level.pinned or not level.x86:
        return []
    done = []
    for key, value in TORCH_ENV[level.level].items():
        if key not in os.environ:
            os.environ[key] = value
            done.append(f"{key}={value}")
    return done


def current_flags() -> frozenset[str]:
    """The CPU's own flags, none hidden (what a benchmark's machine record keeps)."""
    return _identity()[2]


def torch_capability() -> str:
    """torch's own vector level for its kernels ("AVX512", "AVX2", "DEFAULT", ...)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def _identity() -> tuple[str, str, frozenset[str]]:
    """(arch, model name, flags): /proc/cpuinfo's first processor, else sysctl on macOS."""
    arch = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name, flags = cpuinfo_identity(f.read())
    except OSError:
        name, flags = "", frozenset()
    if sys.platform == "darwin" and not flags:
        name, flags = sysctl_identity(arch, _sysctl)
    return arch, name or platform.processor() or arch, flags


def cpuinfo_identity(text: str) -> tuple[str, frozenset[str]]:
    """(model name, flags) of /proc/cpuinfo's first processor: x86's `flags`, ARM64's `Features`
    (ARM64 Linux names no model: its implementer and part numbers stand for it)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep and fields:
            break  # the end of the first processor's block
        fields.setdefault(key.strip(), value.strip())
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    name = fields.get("model name") or ""
    if not name and "CPU implementer" in fields:
        name = f"ARM64 CPU implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    return name, frozenset(flags)


def sysctl_identity(arch: str, sysctl: Callable[[str], str]) -> tuple[str, frozenset[str]]:
    """(model name, flags) of a Mac from `sysctl(key)`: an Apple silicon one's hw.optional features
    as Linux's Features spells them (a key older macOS lacks counts as absent), an Intel one's
    machdep.cpu features as Linux's flags (AVX2, FMA, AVX512F, AVX512VNNI, ...)."""
    name = sysctl("machdep.cpu.brand_string")
    if arch in ARM_ARCHS:
        return name, frozenset(flag for key, flag in DARWIN_ARM.items() if sysctl(key).strip() == "1")
    raw = " ".join(sysctl(k) for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower()
    rename = {"fma": "fma", "f16c": "f16c", "avx2": "avx2", "avx512vnni": "avx512_vnni", "avx1.0": "avx"}
    return name, frozenset(rename.get(f, f) for f in raw.split())


def _sysctl(key: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("%s", message)
