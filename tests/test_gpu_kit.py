"""The GPU kit (docs/gpu.md): `scripts/gpu_check.sh --dry-run` checks everything short of the GPU.

With .whl/ and .whl-host/ built (`bash scripts/gpu_wheels.sh`, which needs PyPI) the whole dry run
runs: the wheel set, pip's resolver offline against the GPU machine's packages, the install, the
trimmed flashinfer, the size of what travels, the run command, and a CPU smoke of every stage.
Without them (a fresh clone, CI) the dry run runs with --without-wheels: everything that needs no
wheel; the wheel checks are skipped, saying why. Neither needs the network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.gpu_kit import lists
from scripts.gpu_kit.cli import main
from scripts.gpu_kit.trim import trimmed_metadata
from scripts.gpu_kit.wheel_files import stand_in_wheel, verify_record

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
HOST = ROOT / ".whl-host" / "site"
HAVE_WHEELS = any(WHEELS.glob("*.whl")) and HOST.is_dir()
NO_WHEELS = "no .whl/ and .whl-host/: run 'bash scripts/gpu_wheels.sh' (needs PyPI) to check the wheel set"


def _dry_run(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "bash",
            "scripts/gpu_check.sh",
            "--dry-run",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=None,
    )


@pytest.mark.skipif(not HAVE_WHEELS, reason=NO_WHEELS)
def test_dry_run_passes():
    done = _dry_run()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    for check in (
        "complete:",
        "wheels:",
        "requirements:",
        "stage install:",
        "flashinfer:",
        "aot:",
        "size:",
        "command:",
        "stage preflight",
        "stage env",
        "stage tests",
        "stages decode, routed, single, eager, fa3",
        "stages with prefill forced to FA2",
        "device run:",
    ):
        assert f"PASS {check}" in done.stdout, check
    assert "dry run: every check passed" in done.stdout


@pytest.mark.skipif(HAVE_WHEELS, reason="test_dry_run_passes runs the whole dry run")
def test_dry_run_without_wheels_passes():
    done = _dry_run("--without-wheels")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "skipping the wheel set" in done.stdout
    assert "PASS complete:" in done.stdout and "PASS stage preflight" in done.stdout
    assert "dry run: every check passed" in done.stdout


def test_dry_run_without_wheels_built_says_what_to_do(tmp_path):
    """Asked for the whole dry run where .whl/ is absent, it fails and names the script that builds it."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_check.sh", tree / "scripts")
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=tree, capture_output=True, text=True)
    assert done.returncode == 1
    assert "run 'bash scripts/gpu_wheels.sh' first" in done.stdout


def test_the_documented_run_call_is_the_scripts():
    command = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--print-command"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    doc = (ROOT / "docs" / "gpu.md").read_text()
    assert f'command="{command}"' in doc and 'carry=[".whl"]' in doc and "timeout_s=480" in doc
    assert len(command) <= 2000


def test_record_check_catches_a_changed_file(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    wheel = stand_in_wheel(good, "demo", "1.0", ["numpy>=1"])
    assert verify_record(wheel) == []
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data + b"X" if info.filename.endswith("METADATA") else data)
    problems = verify_record(bad)
    assert len(problems) == 1 and "METADATA" in problems[0]


def test_trimmed_metadata_drops_only_the_unused_requirements():
    text = "\n".join(
        [
            "Metadata-Version: 2.4",
            "Name: flashinfer-python",
            "Version: 0.7.4",
            "Requires-Dist: apache-tvm-ffi<0.2,>=0.1.11",
            "Requires-Dist: nvidia-cutlass-dsl>=4.8.0",
            "Requires-Dist: cuda-python>=12.0",
            "Requires-Dist: torch",
            'Requires-Dist: nvidia-cutlass-dsl[cu13]>=4.8.0; extra == "cu13"',
            "",
            "body",
        ]
    )
    out, dropped = trimmed_metadata(text, "0.7.4+trim")
    assert dropped == ["nvidia-cutlass-dsl>=4.8.0", "cuda-python>=12.0"]
    assert "Version: 0.7.4+trim" in out and "Requires-Dist: torch" in out and "apache-tvm-ffi" in out
    assert 'extra == "cu13"' in out and out.endswith("body")


@pytest.mark.skipif(not HAVE_WHEELS, reason=NO_WHEELS)
def test_the_resolver_check_fails_without_a_needed_wheel(tmp_path):
    for w in WHEELS.glob("*.whl"):
        if not w.name.startswith("pydantic_core-"):
            shutil.copy(w, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_kit", "resolve", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "pydantic-core" in done.stdout


def test_the_table_reads_what_came_back(tmp_path):
    """`gpu_kit table OUT`: the stages, what was cut, and routed tok/s beside who wrote the tokens."""
    import json

    from scripts.gpu_kit.run_table import table

    summary = {
        "finished": False,
        "elapsed_s": 300.0,
        "budget_s": 420,
        "device": "NVIDIA H100 80GB HBM3",
        "attention_backend": "flashinfer",
        "prefill_backend": "fa2",
        "cut": ["single", "eager"],
        "fallbacks": [],
        "stages": [{"stage": "routed", "status": "ok", "wall_s": 110.0, "cap_s": 150, "note": ""}],
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "bench").mkdir()

    def row(system, tps):
        metrics = {"tok_per_s": tps, "tokens_by_model": {"small": 250, "large": 774}, "handoffs": 9}
        return {"concurrency": 16, "system": system, "metrics": metrics}

    routed = {"summaries": [row("routed", 900.0), row("lockstep", 600.0)]}
    (tmp_path / "bench" / "routed.json").write_text(json.dumps(routed))
    text = "\n".join(table(tmp_path))
    assert "NVIDIA H100" in text and "(NOT FINISHED)" in text and "cut: single, eager" in text
    assert "C=16  routed" in text and " 1.50 " in text and "250/774" in text


def test_an_aot_module_is_checked_against_the_machine_and_the_engine():
    from scripts.gpu_kit.aot import problems

    good = {"needed": ["libcudart.so.13", "libcuda.so.1", "libc.so.6"], "glibc": "2.34", "glibcxx": "3.4.29",
            "exports": ["append_paged_kv_cache"]}  # fmt: skip
    assert problems("page", good) == []
    bad = {**good, "needed": [*good["needed"], "libcurand.so.10"], "glibc": "2.38", "exports": []}
    found = problems("page", bad)
    assert any("libcurand.so.10" in p for p in found) and any("GLIBC_2.38" in p for p in found)
    assert any("append_paged_kv_cache" in p for p in found)
    prefill = {**good, "exports": ["plan", "paged_run"]}
    assert problems("batch_prefill_with_kv_cache_x", prefill) == [
        "batch_prefill_with_kv_cache_x: does not export ['ragged_run'], which flashinfer's prefill.py calls"
    ]


@pytest.mark.skipif(not HAVE_WHEELS, reason=NO_WHEELS)
def test_verify_wheels_checks_the_recorded_requirements(tmp_path, capsys, monkeypatch):
    """The record the offline completeness check reads must be the built wheels' METADATA."""
    assert main(["verify-wheels", str(WHEELS)]) == 0
    record = tmp_path / "gpu_wheels_requires.txt"
    record.write_text(lists.REQUIRES.read_text().replace("Requires-Dist: apache-tvm-ffi>=0.1.11\n", ""))
    monkeypatch.setattr(lists, "REQUIRES", record)
    capsys.readouterr()
    assert main(["verify-wheels", str(WHEELS)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: xgrammar-0.2.9-" in out and "only in the wheel: ['Requires-Dist: apache-tvm-ffi>=0.1.11']" in out
