"""What the CPU offers the engine (engine/native/cpu.py), the one place every CPU choice reads:
its level from the flags, a pin below it (TOKENROUTER_CPU_LEVEL) and never above, the flags a
pin hides (torch's bf16 ops among them), the kernels built per level in their own cache entry,
and the C attention kernel chosen at every level. ARM64's levels (Linux's Features line, a Mac's
sysctl) are checked on any machine, as identities of such CPUs."""

from __future__ import annotations

import re

import pytest
import torch

from tokenrouter import ModelSpec
from tokenrouter.engine import native
from tokenrouter.engine.attention import attention_choice, cpu_paged
from tokenrouter.engine.native import cpu
from tokenrouter.engine.quant import gguf_native

ZEN3 = frozenset({"sse2", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2"})  # an AVX2-only CPU
SKYLAKE_SP = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}  # AVX512 without VNNI
ICELAKE = SKYLAKE_SP | {"avx512_vnni"}
ZEN4 = ICELAKE | {"avx512_bf16"}


def test_the_level_is_the_highest_whose_flags_the_cpu_has():
    assert cpu.offered_level("x86_64", frozenset({"sse2"})) == "plain"
    assert cpu.offered_level("x86_64", ZEN3) == "avx2"
    assert cpu.offered_level("x86_64", SKYLAKE_SP) == "avx2"  # no VNNI: the AVX2 kernels serve it
    assert cpu.offered_level("x86_64", ICELAKE) == "avx512"
    assert cpu.offered_level("aarch64", frozenset({"asimd", "asimddp"})) == "dotprod"
    assert cpu.offered_level("riscv64", ZEN3) == "plain"  # no vector level of its own


def _as(monkeypatch, flags, pin=None, arch="x86_64"):
    """cpu.current() on a CPU of `arch` with `flags` (pinned to `pin`)."""
    monkeypatch.setattr(cpu, "_identity", lambda: (arch, "a CPU", frozenset(flags)))
    if pin is None:
        monkeypatch.delenv(cpu.ENV, raising=False)
    else:
        monkeypatch.setenv(cpu.ENV, pin)
    return cpu.current()


def test_torchs_bf16_ops_are_known_to_raise_below_avx512bw_and_without_native_bf16_are_slow(monkeypatch):
    zen3 = _as(monkeypatch, ZEN3)
    assert "avx512bw, avx512vl and avx512dq, or avx_ne_convert: not on this CPU" in zen3.torch_bf16
    assert _as(monkeypatch, SKYLAKE_SP).torch_bf16 is None  # runs (slowly: the probe's question), at level avx2
    assert _as(monkeypatch, SKYLAKE_SP).level == "avx2" and "avx512f" in _as(monkeypatch, SKYLAKE_SP).flags
    assert not _as(monkeypatch, SKYLAKE_SP).native_bf16 and _as(monkeypatch, ZEN4).native_bf16
    assert _as(monkeypatch, ZEN3 | {"avx_ne_convert"}).torch_bf16 is None  # Intel's AVX-NE-CONVERT CPUs
    assert _as(monkeypatch, ZEN3, arch="aarch64").torch_bf16 is None  # not x86: torch's own affair


def test_a_pin_lowers_the_level_hides_the_flags_above_it_and_never_raises_it(monkeypatch, caplog):
    pinned = _as(monkeypatch, ZEN4, "avx2")
    assert (pinned.level, pinned.offered, pinned.pinned) == ("avx2", "avx512", True)
    assert not any(f.startswith("avx512") for f in pinned.flags) and {"avx2", "fma", "f16c"} <= pinned.flags
    assert "not at CPU level avx2" in pinned.torch_bf16 and not pinned.native_bf16  # bf16 counts as absent
    assert pinned.compile_flags() == ["-march=x86-64-v3", "-mtune=native"]
    assert pinned.describe() == "avx2 (TOKENROUTER_CPU_LEVEL=avx2; this CPU offers avx512)"
    plain = _as(monkeypatch, ZEN4, "plain")
    assert plain.compile_flags()[0] == "-march=x86-64" and not plain.flags & {"avx", "avx2", "fma", "f16c"}
    own = _as(monkeypatch, ZEN4, "avx512")
    assert not own.pinned and own.compile_flags() == ["-march=native"] and own.torch_bf16 is None
    higher = _as(monkeypatch, ZEN3, "avx512")
    assert higher.level == "avx2" and not higher.pinned and "is above it and ignored" in higher.describe()
    monkeypatch.setenv(cpu.ENV, "AVX3")
    with pytest.raises(ValueError, match="TOKENROUTER_CPU_LEVEL='AVX3': must be one of plain, avx2, avx512"):
        cpu.current()
    assert _as(monkeypatch, ZEN3, " AVX2 ").level == "avx2"  # case and spaces as a shell may leave them


def test_a_pin_reaches_torch_where_the_environment_does_not_say(monkeypatch):
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(key, raising=False)
    _as(monkeypatch, ZEN4, "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX")  # the user's own word stays
    assert cpu.pin_torch() == ["ATEN_CPU_CAPABILITY=avx2"]
    assert cpu.current().record()["cpu_level"] == "avx2"
    _as(monkeypatch, ZEN4)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert cpu.pin_torch() == []  # not pinned: torch keeps its own choice


def test_at_gives_each_level_the_machine_runs_and_refuses_the_others():
    here = cpu.current()
    assert cpu.runnable()[0] == "plain" and cpu.runnable()[-1] == here.offered
    for level in cpu.runnable():
        assert cpu.at(level).level == level
    above = cpu.LEVELS[cpu.LEVELS.index(here.offered) + 1 :]
    for level in above:
        with pytest.raises(ValueError, match="this CPU runs"):
            cpu.at(level)


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler")
def test_each_level_builds_once_into_its_own_cache_entry(monkeypatch, tmp_path):
    """Two levels of one library side by side in the store (a pinned run does not throw away the
    machine's own build), each rebuilt only where its sources, compiler or flags changed."""
    monkeypatch.setenv("TOKENROUTER_HOME", str(tmp_path))
    built = {}
    for level in cpu.runnable()[-2:]:
        monkeypatch.setenv(cpu.ENV, level)
        lib, why = gguf_native.load()
        assert lib is not None, why
        assert lib.level == level and f"gguf-{level}-" in lib.path.name
        built[level] = lib.path
    assert all(p.is_file() for p in built.values())
    assert (
        native.build.build(gguf_native.SOURCES, tmp_path / "kernels", cpu.at(cpu.runnable()[-1]))
        == built[cpu.runnable()[-1]]
    )  # found, not rebuilt


@pytest.mark.parametrize("level", cpu.runnable())
def test_auto_attention_on_cpu_is_the_c_kernel_at_every_level(monkeypatch, tiny_model, level):
    """Its plain-C loops too: only it computes a query alike in every step (torch's SDPA tiles by
    the step's shapes), which lossless Speculative needs."""
    monkeypatch.setenv(cpu.ENV, level)
    kernel, why = cpu_paged.load()
    assert kernel is not None, why
    assert kernel.level == level
    chosen = attention_choice(ModelSpec(path=tiny_model), torch.device("cpu"), torch.float32, 64, torch.float16)
    assert chosen.name == "cpu" and chosen.fallback is None


# /proc/cpuinfo's first processor on ARM64 Linux: Graviton 3 (Neoverse V1), Graviton 2 (N1), a Cortex-A57
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
"""
GRAVITON2 = frozenset(
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp".split()
)
CORTEX_A57 = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid".split())
ARM_LADDER = ["plain", "neon", "dotprod", "i8mm"]


def test_arm64_linux_levels_come_from_the_features_line(monkeypatch):
    name, flags = cpu.cpuinfo_identity(GRAVITON3)
    assert name == "ARM64 CPU implementer 0x41 part 0xd40" and {"asimd", "asimddp", "i8mm", "sve"} <= flags
    assert cpu.offered_level("aarch64", flags) == "i8mm"
    assert cpu.offered_level("aarch64", GRAVITON2) == "dotprod"
    assert cpu.offered_level("aarch64", CORTEX_A57) == "neon"
    assert cpu.offered_level("aarch64", flags - {"i8mm"}) == "dotprod"  # svei8mm alone is SVE's, not NEON's
    assert cpu.offered_level("aarch64", frozenset({"fp"})) == "plain"
    g3 = _as(monkeypatch, flags, arch="aarch64")
    assert (g3.level, g3.offered, g3.arm, g3.x86, g3.rank) == ("i8mm", "i8mm", True, False, 5)
    assert g3.torch_bf16 is None and not g3.native_bf16  # torch's bf16 question is x86's
    assert cpu.runnable() == ARM_LADDER and [cpu.at(lv).rank for lv in ARM_LADDER] == [0, 3, 4, 5]


def test_a_macs_levels_come_from_sysctl():
    m2 = {
        "machdep.cpu.brand_string": "Apple M2",
        "hw.optional.AdvSIMD": "1",
        "hw.optional.neon": "1",
        "hw.optional.arm.FEAT_DotProd": "1",
        "hw.optional.arm.FEAT_I8MM": "1",
        "hw.optional.arm.FEAT_BF16": "1",
    }
    name, flags = cpu.sysctl_identity("arm64", lambda key: m2.get(key, ""))
    assert name == "Apple M2" and cpu.offered_level("arm64", flags) == "i8mm"
    m1 = {
        **m2,
        "machdep.cpu.brand_string": "Apple M1",
        "hw.optional.arm.FEAT_I8MM": "0",
        "hw.optional.arm.FEAT_BF16": "0",
    }
    assert cpu.offered_level("arm64", cpu.sysctl_identity("arm64", lambda key: m1.get(key, ""))[1]) == "dotprod"
    old = {"machdep.cpu.brand_string": "Apple M1", "hw.optional.neon": "1"}  # a macOS without the FEAT_ keys
    assert cpu.offered_level("arm64", cpu.sysctl_identity("arm64", lambda key: old.get(key, ""))[1]) == "neon"
    intel = {"machdep.cpu.brand_string": "Intel(R) Core(TM) i9", "machdep.cpu.features": "FPU SSE2 AVX1.0 FMA F16C"}
    intel["machdep.cpu.leaf7_features"] = "AVX2 BMI2 AVX512F AVX512BW AVX512VL AVX512DQ AVX512VNNI"
    name, flags = cpu.sysctl_identity("x86_64", lambda key: intel.get(key, ""))
    assert cpu.offered_level("x86_64", flags) == "avx512" and {"avx", "avx512_vnni"} <= flags


def test_an_arm64_pin_lowers_the_level_and_builds_the_levels_own_flags(monkeypatch, caplog):
    flags = cpu.cpuinfo_identity(GRAVITON3)[1]
    pinned = _as(monkeypatch, flags, "dotprod", arch="aarch64")
    assert (pinned.level, pinned.offered, pinned.pinned, pinned.rank) == ("dotprod", "i8mm", True, 4)
    assert "i8mm" not in pinned.flags and "svei8mm" not in pinned.flags and "asimddp" in pinned.flags
    assert pinned.compile_flags() == ["-march=armv8.2-a+dotprod"]
    assert pinned.describe() == "dotprod (TOKENROUTER_CPU_LEVEL=dotprod; this CPU offers i8mm)"
    assert native.build.flags(pinned)[-1] == "-DTR_LEVEL=4"
    neon = _as(monkeypatch, flags, "neon", arch="aarch64")
    assert neon.compile_flags() == ["-march=armv8-a"] and not neon.flags & {"asimddp", "i8mm", "sve", "bf16"}
    assert _as(monkeypatch, flags, "i8mm", arch="aarch64").compile_flags(GCC) == ["-mcpu=native"]
    assert _as(monkeypatch, flags, "plain", arch="aarch64").compile_flags() == ["-march=armv8-a"]
    higher = _as(monkeypatch, GRAVITON2, "i8mm", arch="aarch64")
    assert higher.level == "dotprod" and "is above it and ignored" in higher.describe()
    x86_pin = _as(monkeypatch, GRAVITON2, "avx2", arch="aarch64")  # a script's pin for x86 machines
    assert x86_pin.level == "dotprod" and "not a level of aarch64 and ignored" in x86_pin.describe()
    assert "avx2 is not a level of aarch64" in caplog.text
    monkeypatch.setenv(cpu.ENV, "sve")
    with pytest.raises(ValueError, match="must be one of plain, neon, dotprod, i8mm"):
        cpu.current()
    _as(monkeypatch, GRAVITON2, arch="aarch64")
    with pytest.raises(ValueError, match="this CPU runs plain, neon, dotprod$"):
        cpu.at("i8mm")


GCC = "aarch64-linux-gnu-gcc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
APPLE_CLANG = "Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0\n"


def test_each_compiler_gets_flags_it_takes_at_the_machines_own_level(monkeypatch):
    """gcc and clang on ARM64 Linux: -mcpu=native. Apple clang: the level's -march (older Xcodes'
    -mcpu=native knows no Apple core); x86 as before."""
    m2 = _as(monkeypatch, {"asimd", "asimddp", "i8mm"}, arch="arm64")
    assert m2.compile_flags(APPLE_CLANG) == ["-march=armv8.4-a+dotprod+i8mm"]
    assert native.build.flags(m2, cc_version=APPLE_CLANG)[-2:] == ["-march=armv8.4-a+dotprod+i8mm", "-DTR_LEVEL=5"]
    m1 = _as(monkeypatch, {"asimd", "asimddp"}, arch="arm64")
    assert m1.compile_flags(APPLE_CLANG) == ["-march=armv8.4-a+dotprod"] and m1.compile_flags(GCC) == ["-mcpu=native"]
    assert _as(monkeypatch, {"asimd", "asimddp"}, "neon", arch="arm64").compile_flags(APPLE_CLANG) == ["-march=armv8-a"]
    assert _as(monkeypatch, ZEN4, arch="x86_64").compile_flags(APPLE_CLANG) == ["-march=native"]
    assert native.build.flags(_as(monkeypatch, ZEN4, "avx2"))[:2] == ["-O3", "-fopenmp"]  # x86's flags as they were
    assert native.build.flags(_as(monkeypatch, ZEN4, "avx2"), openmp=False)[:2] == ["-O3", "-pthread"]


def test_every_level_has_level_hs_number():
    """The number a library reports (tr_level()) names its level through ALL_LEVELS, on any arch."""
    text = (native.build.HERE / "level.h").read_text()
    numbers = {
        name.lower(): int(n) for name, n in re.findall(r"#define TR_(PLAIN|AVX2|AVX512|NEON|DOTPROD|I8MM) (\d+)", text)
    }
    assert numbers == {level: i for i, level in enumerate(cpu.ALL_LEVELS)}
    assert set(cpu.X86_LEVELS) | set(cpu.ARM_LEVELS) == set(cpu.ALL_LEVELS)
    assert cpu.LEVELS == cpu.levels(cpu.current().arch)  # this machine's ladder
