"""The device run (scripts/gpu_check.sh -> `gpu_kit device-run`) degrades one stage at a time, and a kill at
any second leaves every finished stage's JSON and a summary that names what was cut (docs/gpu.md).

The run goes on CPU with GPU_KIT_SIMULATE and a fake clock: no stage command runs (each is logged with the
environment it would get), each takes its expected seconds on the clock or the seconds given, and
GPU_KIT_KILL_AT makes the process SIGKILL itself when the clock passes that second, as the device tool's limit
would. What is under test is the run's own logic: the order, the caps and the budget, which later stages run
with what, and what reaches $OUT. The pre-flight also runs for real against a stand-in flashinfer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.gpu_kit.device_run import BACKGROUND, STAGES
from scripts.gpu_kit.jit_report import jit_report
from scripts.gpu_kit.nvcc_jobs import FA2_JOB_BYTES, NVCC_JOB_BYTES, max_jobs

ROOT = Path(__file__).resolve().parent.parent
BENCH = ("decode", "routed", "single")


def _run(tmp_path: Path, simulate: str, kill_at: float | None = None, fake_flashinfer: str | None = None, **env_kw):
    work, out = tmp_path / "work", tmp_path / "out"
    if fake_flashinfer is not None:
        (work / "site-fi" / "flashinfer").mkdir(parents=True)
        (work / "site-fi" / "flashinfer" / "__init__.py").write_text(fake_flashinfer)
    env = {
        **os.environ,
        "GPU_KIT_SIMULATE": simulate,
        "GPU_KIT_FAKE_CLOCK": "1",
        "GPU_KIT_WORK": str(work),
        "GPU_KIT_PYTHON": sys.executable,
        "OUT": str(out),
        "CUDA_VISIBLE_DEVICES": "",
        "TOKENROUTER_PREFILL_BACKEND": "fa3",  # a stray value from outside: the run sets its own
        **env_kw,
    }
    if kill_at is not None:
        env["GPU_KIT_KILL_AT"] = str(kill_at)
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    if kill_at is None:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    else:
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    commands = {}
    log = work / "commands.log"
    for line in log.read_text().splitlines() if log.is_file() else []:
        stage, pythonpath, prefill, dlpack, jobs, command = line.split("\t")
        commands[stage] = {
            "pythonpath": pythonpath.split("=", 1)[1].split(os.pathsep),
            "prefill": prefill.split("=", 1)[1],
            "dlpack_off": dlpack.split("=", 1)[1] == "1",
            "max_jobs": jobs.split("=", 1)[1],
            "command": command,
        }
    summary = json.loads((out / "summary.json").read_text())
    stages = {s["stage"]: s for s in summary["stages"]}
    return {"log": (out / "gpu_check.log").read_text(), "commands": commands, "summary": summary, "stages": stages,
            "work": work, "out": out}  # fmt: skip


def _flashinfer_on_path(r: dict, stage: str) -> bool:
    return str(r["work"] / "site-fi") in r["commands"][stage]["pythonpath"]


def test_all_well_runs_every_stage_in_order_within_the_budget(tmp_path):
    r = _run(tmp_path, "install=0")
    s = r["summary"]
    assert s["finished"] and s["cut"] == [] and s["running"] is None and s["fallbacks"] == []
    assert s["attention_backend"] == "flashinfer" and s["elapsed_s"] <= s["budget_s"] == 420
    fg = [x["stage"] for x in s["stages"] if x["note"] != "in the background"]
    assert fg == list(STAGES)
    assert {x["stage"] for x in s["stages"]} == set(STAGES) | set(BACKGROUND)
    assert all(x["status"] == "ok" for x in s["stages"])
    for name in [*STAGES, *BACKGROUND]:
        assert json.loads((r["out"] / f"{name}.json").read_text())["stage"] == name
    # the headline numbers first: decode and routed before the tests, FA3 last
    assert fg.index("decode") < fg.index("routed") < fg.index("tests") < fg.index("single") < fg.index("fa3")
    for stage in (*BENCH, "tests", "eager"):
        assert _flashinfer_on_path(r, stage) and r["commands"][stage]["prefill"] == "fa2"
    for stage in (*BENCH, "eager"):
        assert "--prefill-backend fa2" in r["commands"][stage]["command"]
    assert r["commands"]["fa3"]["prefill"] == "" and "--steps fa3" in r["commands"]["fa3"]["command"]
    routed = r["commands"]["routed"]["command"]
    assert "--quick" in routed and f"--out {r['out'] / 'bench'}" in routed  # results land in $OUT as they come
    assert f"--pair-dir {r['work'] / 'random-pair'}" in routed  # the 4 GB pair does not
    assert "!!" not in r["log"] and "routed.json" not in r["log"]  # the table: no bench ran for real
    assert r["commands"]["preflight"]["dlpack_off"]  # before tvm-ffi's add-on is built, nobody builds it
    assert not r["commands"]["tests"]["dlpack_off"]  # after (its background job ended at 70 s)
    assert int(r["commands"]["kernels"]["max_jobs"]) >= 1


def _expected_timeline() -> list[tuple[str, float, float]]:
    """(stage, start, end) of the all-well simulated run, foreground stages only."""
    t, out = 0.0, []
    for name, (_, expected) in STAGES.items():
        start = t
        if name == "decode":  # waits for the random-weight pair, started after install, as part of its stage
            t = max(t, STAGES["install"][1] + BACKGROUND["models"][1])
        out.append((name, start, t + expected))
        t += expected
    return out


_rng = random.Random(53)
# the run's 395 s, the report's last 5 aside; and two fixed: in install, and while decode waits for the pair
KILLS = [5.0, 45.0] + sorted(_rng.uniform(1, 390) for _ in range(8))


@pytest.mark.parametrize("kill_at", KILLS, ids=[f"{k:.0f}s" for k in KILLS])
def test_a_kill_at_a_random_second_leaves_each_finished_stage_and_names_what_was_cut(tmp_path, kill_at):
    r = _run(tmp_path, "install=0", kill_at=kill_at)
    s = r["summary"]
    assert not s["finished"]
    timeline = _expected_timeline()
    finished = [n for n, _, end in timeline if end <= kill_at]
    running = next(n for n, start, end in timeline if start <= kill_at < end)
    for name in finished:
        assert (r["out"] / f"{name}.json").is_file(), name
        assert r["stages"][name]["status"] == "ok"
    assert not (r["out"] / f"{running}.json").exists()
    assert s["running"]["stage"] == running
    later = [n for n, start, _ in timeline if start > kill_at]
    assert s["cut"][0] == running and set(later) <= set(s["cut"])
    assert not set(finished) & set(s["cut"])


def test_a_stage_past_its_cap_is_cut_and_the_rest_run(tmp_path):
    r = _run(tmp_path, "routed=0@400")
    assert r["stages"]["routed"]["status"] == "timed out" and r["stages"]["routed"]["wall_s"] == 150
    cut = r["summary"]["cut"]
    assert cut[0] == "routed" and all(r["stages"][n]["status"] == "skipped: no time left" for n in cut[1:])
    assert r["stages"]["tests"]["status"] == "ok"


def test_a_slow_stage_eats_the_budget_and_the_last_stages_are_skipped(tmp_path):
    r = _run(tmp_path, "install=0@40 routed=0@149 single=0@89")
    s = r["summary"]
    skipped = [x["stage"] for x in s["stages"] if x["status"] == "skipped: no time left"]
    assert skipped and skipped == [n for n in STAGES if n in skipped] and "report" in skipped
    assert set(skipped) <= set(s["cut"]) and s["finished"]
    assert s["elapsed_s"] <= s["budget_s"]
    assert "routed" not in s["cut"] and r["stages"]["routed"]["status"] == "ok"


def test_failed_kernels_send_the_later_stages_to_torch(tmp_path):
    r = _run(tmp_path, "kernels=1")
    s = r["summary"]
    assert s["attention_backend"] == "torch" and s["prefill_backend"] is None
    assert len(s["fallbacks"]) == 1 and "page and FA2 kernels" in s["fallbacks"][0]
    for stage in (*BENCH, "tests"):
        assert not _flashinfer_on_path(r, stage) and r["commands"][stage]["prefill"] == ""
        assert "--prefill-backend" not in r["commands"][stage]["command"]
    for stage in ("eager", "kernels-fa3", "fa3", "report"):
        assert stage not in r["commands"] and r["stages"][stage]["status"] == "skipped: torch backend"
    assert "!! flashinfer " in r["log"]


def test_failed_fa3_kernels_skip_only_the_fa3_stage(tmp_path):
    r = _run(tmp_path, "kernels-fa3=1")
    assert r["summary"]["attention_backend"] == "flashinfer"
    assert r["stages"]["fa3"]["status"] == "skipped: FA3's kernels did not load or build"
    assert r["stages"]["report"]["status"] == "ok"


RAISES = "raise OSError('libcuda.so.1: cannot open shared object file')\n"


def test_flashinfer_raising_in_the_preflight_falls_back_to_torch(tmp_path):
    """The pre-flight runs for real (on CPU its CUDA parts fail too); the stand-in flashinfer raises OSError."""
    r = _run(tmp_path, "preflight=run", fake_flashinfer=RAISES)
    assert r["stages"]["preflight"]["rc"] == 2 and r["summary"]["attention_backend"] == "torch"
    report = r["stages"]["preflight"]["result"]
    assert report["rc"] == 2 and not report["flashinfer"]["ok"]
    assert report["flashinfer"]["error"] == "OSError: libcuda.so.1: cannot open shared object file"
    assert r["stages"]["kernels"]["status"] == "skipped: torch backend"
    assert json.loads((r["out"] / "preflight.json").read_text())["result"]["rc"] == 2


def test_a_failed_cuda_part_of_the_preflight_is_reported_and_the_run_goes_on(tmp_path):
    r = _run(tmp_path, "preflight=run", fake_flashinfer="__version__ = '0.7.4+stand-in'\n")
    s = r["summary"]
    assert r["stages"]["preflight"]["rc"] == 1 and s["attention_backend"] == "flashinfer"
    assert s["fallbacks"] == ["preflight: a CUDA part failed (preflight.json); the engine may run without CUDA graphs"]
    report = r["stages"]["preflight"]["result"]
    assert report["flashinfer"]["ok"] and report["flashinfer"]["version"] == "0.7.4+stand-in"
    assert not report["pinned"]["ok"] and not report["graph"]["ok"]
    assert "toolkit" in report and "kernels" in r["commands"]


def test_with_no_time_left_every_stage_is_skipped_and_the_summary_still_written(tmp_path):
    r = _run(tmp_path, "install=0", GPU_KIT_BUDGET_S="10")  # under the 20 s a stage needs
    s = r["summary"]
    assert set(r["commands"]) == set()  # nothing ran: not even install, so no background job started
    assert r["stages"]["install"]["status"] == "skipped: no time left"
    assert s["attention_backend"] == "torch" and s["finished"]
    assert s["fallbacks"] == ["attention torch: flashinfer was not checked (no time left)"]


def test_nvcc_jobs_are_capped_by_memory():
    gib = 1 << 30
    assert max_jobs(16, 120 * gib) == 16  # the H100 machine: 128 GiB, 16 cores
    assert max_jobs(16, 48 * gib) == 8  # (48 - 16 reserved) / 4 GiB a job
    assert max_jobs(16, 10 * gib) == 1 and max_jobs(16, None) == 16
    assert max_jobs(16, 20 * gib, FA2_JOB_BYTES) == 8  # FA2 only (the JIT fallback): 0.5 GiB a job
    assert NVCC_JOB_BYTES >= int(3.5 * gib)  # an FA3 nvcc job's measured peak


def test_jit_report_lists_what_the_warm_up_did_not_foresee():
    warm = [{"part": "fa2", "modules": ["page", "fa2_a"]}, {"part": "fa3", "modules": ["fa3_a_sm90"]}]
    r = jit_report(["fa2_a", "fa3_a_sm90", "fa3_window_sm90", "page"], warm, "auto")
    assert r["not_in_warm"] == ["fa3_window_sm90"] and r["warm_missing"] == []
    r = jit_report(["fa2_a", "page"], warm, "fa2")
    assert r["warm_missing"] == ["fa3_a_sm90"] and r["fa3_built"] == [] and r["prefill_backend"] == "fa2"
