"""scripts/gpu_check.sh degrades one stage at a time (docs/gpu.md, "What degrades how").

The script runs on CPU with GPU_KIT_SIMULATE: each stage named there returns the status given instead of running
(the others pretend success, or run for real where named `=run`), and every command a stage would run is logged
with the environment it would get. What is under test is the script's own logic: which later stages run, with
what PYTHONPATH, prefill backend and bench arguments, and what summary.json records. The pre-flight and the
import stage also run for real against a stand-in flashinfer whose import raises OSError.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.gpu_kit.jit_report import jit_report
from scripts.gpu_kit.nvcc_jobs import NVCC_JOB_BYTES, max_jobs

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, simulate: str, fake_flashinfer: str | None = None) -> dict:
    assert simulate, "an empty GPU_KIT_SIMULATE simulates nothing: the stages would run for real"
    work, out = tmp_path / "work", tmp_path / "out"
    if fake_flashinfer is not None:
        (work / "site-fi" / "flashinfer").mkdir(parents=True)
        (work / "site-fi" / "flashinfer" / "__init__.py").write_text(fake_flashinfer)
    env = {
        **os.environ,
        "GPU_KIT_SIMULATE": simulate,
        "GPU_KIT_WORK": str(work),
        "GPU_KIT_PYTHON": sys.executable,
        "OUT": str(out),
        "CUDA_VISIBLE_DEVICES": "",
        "TOKENROUTER_PREFILL_BACKEND": "fa3",  # a stray value from outside: the script starts from auto
    }
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "gpu_check.log").read_text()
    commands = {}
    for line in (work / "commands.log").read_text().splitlines():
        stage, pythonpath, prefill, jobs, command = line.split("\t")
        commands[stage] = {
            "pythonpath": pythonpath.split("=", 1)[1].split(":"),
            "prefill": prefill.split("=", 1)[1],
            "max_jobs": int(jobs.split("=", 1)[1]),
            "command": command,
        }
    summary = json.loads((out / "summary.json").read_text())
    stages = {s["stage"]: s for s in summary["stages"]}
    return {"log": log, "commands": commands, "summary": summary, "stages": stages, "work": work}


def _ran(r: dict, stage: str) -> bool:
    return stage in r["commands"] or r["stages"][stage]["rc"] != -1


def _flashinfer_on_path(r: dict, stage: str) -> bool:
    return str(r["work"] / "site-fi") in r["commands"][stage]["pythonpath"]


BENCH = ("routed", "eager", "single")


def test_all_well_keeps_flashinfer_and_auto_prefill(tmp_path):
    r = _run(tmp_path, "install=0")
    s = r["summary"]
    assert s["attention_backend"] == "flashinfer" and s["prefill_backend"] == "auto" and s["fallbacks"] == []
    order = ["install", "preflight", "env", "import", "jit-fa2", "jit-fa3", "models", "tests", *BENCH, "report"]
    assert [x["stage"] for x in s["stages"]] == order
    assert all(x["rc"] == 0 for x in s["stages"])
    assert "--part fa2" in r["commands"]["jit-fa2"]["command"] and "--part fa3" in r["commands"]["jit-fa3"]["command"]
    assert "TVM_FFI_DISABLE_TORCH_C_DLPACK=1" in r["commands"]["preflight"]["command"]
    for stage in ("tests", *BENCH):
        assert _flashinfer_on_path(r, stage) and r["commands"][stage]["prefill"] == ""
    for stage in BENCH:
        assert "--prefill-backend" not in r["commands"][stage]["command"]
    assert "!!" not in r["log"]
    assert r["commands"]["jit-fa3"]["max_jobs"] >= 1


@pytest.mark.parametrize("rc", ["1", "124"])
def test_a_failed_or_timed_out_fa3_build_keeps_flashinfer_with_fa2_prefill(tmp_path, rc):
    r = _run(tmp_path, f"jit-fa3={rc}")
    s = r["summary"]
    assert s["attention_backend"] == "flashinfer" and s["prefill_backend"] == "fa2"
    assert len(s["fallbacks"]) == 1 and s["fallbacks"][0].startswith("prefill fa2: FA3 ")
    assert r["stages"]["jit-fa3"]["rc"] == int(rc)
    assert r["commands"]["tests"]["prefill"] == "fa2" and _flashinfer_on_path(r, "tests")
    for stage in BENCH:  # eager too: graphs stay on with flashinfer
        assert _flashinfer_on_path(r, stage)
        assert "--prefill-backend fa2" in r["commands"][stage]["command"]
    assert "--prefill-backend fa2" in r["commands"]["report"]["command"]
    assert "!! FA3 " in r["log"] and "prefill forced to FA2" in r["log"]


def _assert_torch(r: dict, skipped: tuple[str, ...]):
    s = r["summary"]
    assert s["attention_backend"] == "torch" and s["prefill_backend"] is None
    assert len(s["fallbacks"]) == 1 and s["fallbacks"][0].startswith("attention torch: flashinfer ")
    for stage in skipped:
        assert stage not in r["commands"], stage
        assert r["stages"][stage]["rc"] == -1 and r["stages"][stage]["note"].startswith("skipped: torch backend")
    assert not _flashinfer_on_path(r, "tests") and r["commands"]["tests"]["prefill"] == ""
    for stage in ("routed", "single"):
        assert not _flashinfer_on_path(r, stage) and "--prefill-backend" not in r["commands"][stage]["command"]
    assert "eager" not in r["commands"] and r["stages"]["eager"]["rc"] == -1
    assert "report" not in r["stages"]
    assert "!! flashinfer " in r["log"] and "torch's attention backend" in r["log"]


def test_a_failed_page_and_fa2_build_falls_back_to_torch(tmp_path):
    r = _run(tmp_path, "jit-fa2=1")
    _assert_torch(r, ("jit-fa3",))
    assert r["stages"]["jit-fa2"]["rc"] == 1
    assert "failed to build its page and FA2 kernels" in r["summary"]["fallbacks"][0]


RAISES = "raise OSError('libcuda.so.1: cannot open shared object file')\n"


def test_flashinfer_raising_in_the_preflight_falls_back_to_torch(tmp_path):
    """The pre-flight runs for real (on CPU its CUDA parts fail too); the stand-in flashinfer raises OSError."""
    r = _run(tmp_path, "preflight=run", fake_flashinfer=RAISES)
    _assert_torch(r, ("import", "jit-fa2", "jit-fa3"))
    assert r["stages"]["preflight"]["rc"] == 2
    report = json.loads((r["work"] / "preflight.json").read_text())
    assert report["rc"] == 2 and not report["flashinfer"]["ok"]
    assert report["flashinfer"]["error"] == "OSError: libcuda.so.1: cannot open shared object file"
    assert "OSError" in report["flashinfer"]["traceback"]
    assert r["summary"]["preflight"]["flashinfer"]["ok"] is False  # the summary includes it


def test_flashinfer_raising_at_the_import_stage_falls_back_to_torch(tmp_path):
    r = _run(tmp_path, "import=run", fake_flashinfer=RAISES)
    _assert_torch(r, ("jit-fa2", "jit-fa3"))
    assert r["stages"]["import"]["rc"] == 1 and "OSError: libcuda.so.1" in r["log"]


def test_a_failed_cuda_part_of_the_preflight_is_reported_and_the_run_goes_on(tmp_path):
    """Real pre-flight on CPU with a stand-in flashinfer that imports: pinned memory and the graph fail (no CUDA),
    exit 1; flashinfer stays and its stages run."""
    r = _run(tmp_path, "preflight=run", fake_flashinfer="__version__ = '0.7.4+stand-in'\n")
    s = r["summary"]
    assert r["stages"]["preflight"]["rc"] == 1
    assert s["attention_backend"] == "flashinfer" and s["prefill_backend"] == "auto"
    assert s["fallbacks"] == ["preflight: a CUDA part failed (preflight.json); the engine may run without CUDA graphs"]
    assert s["preflight"]["flashinfer"] == {
        "ok": True,
        "version": "0.7.4+stand-in",
        "file": str(r["work"] / "site-fi" / "flashinfer" / "__init__.py"),
        "s": s["preflight"]["flashinfer"]["s"],
    }
    assert not s["preflight"]["pinned"]["ok"] and not s["preflight"]["graph"]["ok"]
    assert all(stage in r["commands"] for stage in ("import", "jit-fa2", "jit-fa3", "eager"))


def test_with_no_time_left_every_stage_is_skipped_and_the_summary_still_written(tmp_path, monkeypatch):
    """A stage skipped for lack of time counts as failed: the pre-flight did not prove flashinfer, so torch."""
    monkeypatch.setenv("GPU_KIT_BUDGET_S", "10")  # under the 20 s a stage needs
    r = _run(tmp_path, "install=0")
    assert set(r["commands"]) == {"models"}  # the random-weight pair is not a budgeted stage
    assert r["stages"]["preflight"]["note"].startswith("skipped: no time left")
    assert r["summary"]["attention_backend"] == "torch"
    assert r["summary"]["fallbacks"] == [
        "attention torch: flashinfer was not checked (no time left for the pre-flight)"
    ]
    assert all(s["rc"] == -1 for name, s in r["stages"].items() if name != "models")


def test_nvcc_jobs_are_capped_by_memory():
    gib = 1 << 30
    assert max_jobs(16, 120 * gib) == 16  # the H200 machine: 128 GiB, 16 cores
    assert max_jobs(16, 48 * gib) == 8  # (48 - 16 reserved) / 4 GiB a job
    assert max_jobs(16, 10 * gib) == 1 and max_jobs(16, None) == 16
    assert NVCC_JOB_BYTES >= int(3.5 * gib)  # an FA3 nvcc job's measured peak


def test_jit_report_lists_what_the_warm_up_did_not_foresee():
    warm = [{"part": "fa2", "modules": ["page", "fa2_a"]}, {"part": "fa3", "modules": ["fa3_a_sm90"]}]
    r = jit_report(["fa2_a", "fa3_a_sm90", "fa3_window_sm90", "page"], warm, "auto")
    assert r["not_in_warm"] == ["fa3_window_sm90"] and r["warm_missing"] == []
    r = jit_report(["fa2_a", "page"], warm, "fa2")
    assert r["warm_missing"] == ["fa3_a_sm90"] and r["fa3_built"] == [] and r["prefill_backend"] == "fa2"
