"""What the CPU offers the engine (engine/native/cpu.py), the one place every CPU choice reads:
its level from the flags, a pin below it (TOKENROUTER_CPU_LEVEL) and never above, the flags a
pin hides (torch's bf16 ops among them), the kernels built per level in their own cache entry,
and the C attention kernel chosen at every level."""

from __future__ import annotations

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
    assert cpu.offered_level("aarch64", frozenset({"asimd", "asimddp"})) == "plain"  # ARM: plain C for now


def _as(monkeypatch, flags, pin=None, arch="x86_64"):
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
