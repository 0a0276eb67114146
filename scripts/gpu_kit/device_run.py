"""`device-run`: the GPU kit's one command on the GPU machine (`bash scripts/gpu_check.sh` runs it), about 7
minutes (GPU_KIT_BUDGET_S=420) inside the device call's 480 s. The headline numbers come first, every stage
writes `$OUT/<stage>.json` as it ends and `$OUT/summary.json` is rewritten at every start and end, so a kill at
any second leaves what finished and a summary whose `cut` names what did not.

The stages, in order (docs/gpu.md has the table): install the carried wheels and unpack the prebuilt (AOT)
flashinfer modules; in the background the random-weight pair, tvm-ffi's torch add-on and the env report;
preflight; kernels (the AOT modules loaded, each reported as AOT or JIT; the JIT builds FA2 only as a
fallback); decode (one step per model at B = 1, 16, 64 against the memory floor); routed (C = 16, 64, 1, every
system at a level before the next); tests (the gpu tests, prefill on FA2); single; eager; kernels-fa3 and fa3
(only with time left); report. One stage's failure degrades the next ones, never stops the run: flashinfer
failing the pre-flight or its kernels sends the later stages to torch's attention on CUDA.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tarfile
import threading
from pathlib import Path

from .lists import ROOT
from .nvcc_jobs import FA2_JOB_BYTES, NVCC_JOB_BYTES, max_jobs, mem_available
from .stage_runner import RUNNING, Clock, FakeClock, Job, Log, Simulation, kill_group, run_command

MIN_STAGE_S = 20  # a stage with less left than this is skipped, and counts as cut
# name: (cap, expected seconds); the expected times are what a simulated stage spends (docs/gpu.md's table)
STAGES = {
    "install": (60, 10),
    "preflight": (45, 15),
    "kernels": (150, 10),
    "decode": (120, 75),
    "routed": (150, 110),
    "tests": (90, 40),
    "single": (90, 60),
    "eager": (45, 20),
    "kernels-fa3": (60, 5),
    "fa3": (45, 25),
    "report": (20, 5),
}
BACKGROUND = {"models": (200, 45), "tvm-ffi": (150, 60), "env": (60, 10)}
NEEDS_MODELS = {"decode", "routed", "single", "eager", "fa3"}


class DeviceRun:
    """The run's state between stages: the budget and clock, the backends later stages get (torch's
    after a flashinfer failure), each stage's record, the background jobs, and what $OUT says."""

    def __init__(self, out: Path, work: Path, budget: float, clock: Clock, sim: Simulation | None, log: Log):
        self.out, self.work, self.budget, self.clock, self.sim, self.say = out, work, budget, clock, sim, log
        self.py = os.environ.get("GPU_KIT_PYTHON", sys.executable)
        self.site, self.fisite = work / "site", work / "site-fi"
        self.records: list[dict] = []
        self.jobs: dict[str, Job] = {}
        self.running: dict | None = None
        self.attention, self.prefill, self.fallbacks = "flashinfer", "fa2", []
        self.addon_ready = False
        self.finished = False
        # nvcc jobs at once, should the JIT build: one a core, fewer where memory is short (nvcc_jobs.py)
        cores, mem = os.cpu_count() or 1, mem_available()
        self.jit_jobs = {"fa2": max_jobs(cores, mem, FA2_JOB_BYTES), "fa3": max_jobs(cores, mem, NVCC_JOB_BYTES)}

    # ---- the environment every stage gets --------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        path = [str(ROOT), str(self.site)] + ([str(self.fisite)] if self.attention == "flashinfer" else [])
        env.update(
            PYTHONPATH=os.pathsep.join(path),
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            TOKENROUTER_HOME=str(self.work / "home"),
            FLASHINFER_WORKSPACE_BASE=str(self.work),
            TVM_FFI_CACHE_DIR=str(self.work / "tvm-ffi"),
            FLASHINFER_NVCC_THREADS="1",
        )
        jobs = self.jit_jobs["fa3" if (self.running or {}).get("stage") == "kernels-fa3" else "fa2"]
        env.update(MAX_JOBS=str(jobs), FLASHINFER_JIT_PREBUILD_MAX_JOBS=str(jobs))
        if not self.addon_ready:  # until tvm-ffi's torch add-on is built, nobody else starts building it
            env["TVM_FFI_DISABLE_TORCH_C_DLPACK"] = "1"
        if self.attention == "flashinfer" and self.prefill == "fa2":
            env["TOKENROUTER_PREFILL_BACKEND"] = "fa2"
        else:
            env.pop("TOKENROUTER_PREFILL_BACKEND", None)
        return env

    def left(self) -> float:
        return self.budget - self.clock.now()

    # ---- what is written as the run goes ----------------------------------------------------------------
    def write_summary(self) -> None:
        done = {r["stage"] for r in self.records}
        order = list(STAGES) + list(BACKGROUND)
        not_reached = [
            s for s in order if s not in done and s not in self.jobs and s != (self.running or {}).get("stage")
        ]
        background = [j for j in self.jobs if j not in done]  # started, not yet recorded
        cut = [r["stage"] for r in self.records if r["status"] in ("skipped: no time left", "timed out")]
        if not self.finished:
            cut += ([self.running["stage"]] if self.running else []) + background + not_reached
        summary = {
            "finished": self.finished,
            "elapsed_s": round(self.clock.now(), 1),
            "budget_s": self.budget,
            "running": self.running,
            "cut": cut,
            "background": background,
            "not_reached": not_reached,
            "attention_backend": self.attention,
            "prefill_backend": self.prefill if self.attention == "flashinfer" else None,
            "fallbacks": self.fallbacks,
            "device": self.device(),
            "stages": self.records,
            "results": sorted(
                str(p.relative_to(self.out)) for p in self.out.rglob("*.json") if p.name != "summary.json"
            ),
        }
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
        tmp.replace(self.out / "summary.json")  # a kill mid-write leaves the previous summary whole

    def device(self) -> str | None:
        pre = self.out / "preflight.json"
        if pre.is_file():
            r = json.loads(pre.read_text()).get("result") or {}
            return (r.get("pinned") or {}).get("device") or (r.get("toolkit") or {}).get("gpu")
        return None

    def record(
        self, name: str, cap: float, started: float, rc: int | None, note: str = "", ended: float | None = None, **extra
    ) -> dict:
        """A stage's record, to $OUT/<name>.json and the summary's list; `ended`: where not now (a background
        job that ended before the run looked)."""
        status = "ok" if rc == 0 else "timed out" if rc in (124, 137) else note if rc is None else f"exit {rc}"
        rec = {
            "stage": name,
            "status": status,
            "rc": rc,
            "cap_s": round(cap),
            "started_s": round(started, 1),
            "wall_s": round((self.clock.now() if ended is None else ended) - started, 1),
            "attention_backend": self.attention,
            "prefill_backend": self.prefill if self.attention == "flashinfer" else None,
            "device": self.device(),  # what the pre-flight read (None before it, or where it failed)
            "note": note,
            **extra,
        }
        self.records.append(rec)
        (self.out / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        return rec

    # ---- stages -------------------------------------------------------------------------------------
    def stage(self, name: str, cmd: list[str], result: Path | None = None, note: str = "") -> int:
        """Run one stage under min(cap, time left); -1 where it was skipped for lack of time."""
        cap, expected = STAGES[name]
        self.poll_jobs()
        if name in NEEDS_MODELS and "models" in self.jobs and not self.jobs["models"].recorded:
            self.running = {"stage": name, "started_s": round(self.clock.now(), 1), "waiting_for": "models"}
            self.write_summary()
            self.wait_job("models")
        left = self.left()
        if left < MIN_STAGE_S:
            self.say(f"== {name}: skipped: no time left ({left:.0f} s of the budget)")
            self.record(name, cap, self.clock.now(), None, "skipped: no time left")
            self.write_summary()
            return -1
        cap = min(cap, left)
        started = self.clock.now()
        self.running = {"stage": name, "started_s": round(started, 1), "cap_s": round(cap)}
        self.write_summary()
        self.say(f"== [{started:.0f} s] {name} (cap {cap:.0f} s): {' '.join(map(str, cmd))}")
        env = self.env()
        outcome = self.sim.outcome(name, expected) if self.sim else None
        if outcome is not None:
            self.sim.record(name, cmd, env)
            rc, secs = outcome
            if rc in (124, 137) or secs > cap:
                rc, secs = 124, cap
            self.clock.spend(secs)
        else:
            rc = run_command([str(c) for c in cmd], env, cap, self.say)
        self.running = None
        extra = {}
        if result is not None and result.is_file():
            try:
                extra["result"] = json.loads(result.read_text())
            except ValueError:
                extra["result"] = result.read_text()[-2000:]
        rec = self.record(name, cap, started, rc, note, **extra)
        self.say(f"== {name}: {rec['status']} after {rec['wall_s']} s")
        self.write_summary()
        return rc

    def skip(self, name: str, why: str) -> None:
        self.say(f"== {name}: skipped: {why}")
        self.record(name, STAGES[name][0], self.clock.now(), None, f"skipped: {why}")
        self.write_summary()

    def start_job(self, name: str, cmd: list[str], log_path: Path, result: Path | None = None) -> None:
        cap, expected = BACKGROUND[name]
        if self.left() < MIN_STAGE_S:
            self.say(f"== {name}: not started: no time left")
            return
        job = Job(name, cap, self.clock.now(), expected)
        self.jobs[name] = job
        env = self.env()
        self.say(f"== [{job.started:.0f} s] {name} in the background (cap {cap} s): {' '.join(map(str, cmd))}")
        outcome = self.sim.outcome(name, expected) if self.sim else None
        if outcome is not None:
            self.sim.record(name, cmd, env)
            job.rc, job.expected = outcome
            job.extra["result_path"] = result
            return

        def body():
            job.rc = run_command([str(c) for c in cmd], env, cap, self.say, output=log_path)
            job.ended = self.clock.now()

        job.extra["result_path"], job.extra["log"] = result, log_path
        job.thread = threading.Thread(target=body, daemon=True)
        job.thread.start()

    def poll_jobs(self) -> None:
        for job in self.jobs.values():
            if not job.recorded and job.done(self.clock.now()):
                self.finish_job(job)

    def wait_job(self, name: str) -> None:
        job = self.jobs.get(name)
        if job is None or job.recorded:
            return
        t0 = self.clock.now()
        if job.thread is None:
            self.clock.spend(max(0.0, job.started + job.expected - t0))
        else:
            job.thread.join(timeout=max(1.0, self.left()))
        job.waited_s = round(self.clock.now() - t0, 1)
        if job.waited_s:
            self.say(f"== waited {job.waited_s} s for {name}")
        self.finish_job(job)

    def finish_job(self, job: Job) -> None:
        job.recorded = True
        if job.thread is not None and job.thread.is_alive():
            rc, note = None, "not finished when the run needed it"
        else:
            rc, note = job.rc, "in the background"
        extra = {"waited_s": job.waited_s}
        res = job.extra.get("result_path")
        if res is not None and Path(res).is_file():
            extra["result"] = json.loads(Path(res).read_text())
        log = job.extra.get("log")
        if log is not None and Path(log).is_file():
            extra["log_tail"] = Path(log).read_text()[-1500:]
        end = job.ended if job.ended is not None else min(self.clock.now(), job.started + job.expected)
        rec = self.record(job.name, job.cap, job.started, rc, note, ended=end, **extra)
        self.say(f"== {job.name} (background): {rec['status']} after {rec['wall_s']} s")
        if job.name == "tvm-ffi" and rc == 0:
            self.addon_ready = True
        self.write_summary()

    # ---- degradations ---------------------------------------------------------------------------------
    def torch_backend(self, why: str) -> None:
        if self.attention != "torch":
            self.attention = "torch"
            self.fallbacks.append(f"attention torch: flashinfer {why}")
            self.say(f"!! flashinfer {why}: the later stages run torch's attention backend on CUDA (no CUDA graphs)")


def unpack_aot(wheels: Path, fisite: Path) -> dict:
    """The prebuilt modules into the installed flashinfer, where it looks first (`data/aot/<name>/<name>.so`)."""
    archive = wheels / "flashinfer-aot.tar.xz"
    if not archive.is_file():
        return {"aot": "none carried: the kernels stage JIT-builds"}
    dest = fisite / "flashinfer" / "data" / "aot"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return {"aot": sorted(p.parent.name for p in dest.glob("*/*.so"))}


def cmd_unpack_aot(args) -> int:
    r = unpack_aot(Path(args.wheels), Path(args.site))
    print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r))
    return 0


def plan(run: DeviceRun, wheels: Path, bench_extra: list[str]) -> None:
    """The stages in their order, with the decisions between them."""
    py, out, work = run.py, run.out, run.work
    kit = [py, "-m", "scripts.gpu_kit"]
    base = [str(w) for w in sorted(wheels.glob("*.whl")) if not w.name.startswith("flashinfer_python-")]
    fi = [str(w) for w in sorted(wheels.glob("flashinfer_python-*.whl"))]
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade"]
    tok = ["--tokenizer", str(work / "tokenizer")] if (wheels / "tokenizer.tar.xz").is_file() else []
    install = (  # the tokenizer first: the benchmarks need it whatever becomes of the wheels
        "set -e; "
        + (f"mkdir -p {work}/tokenizer; tar -xJf {wheels}/tokenizer.tar.xz -C {work}/tokenizer; " if tok else "")
        + f"{' '.join(pip)} --target {run.site} {' '.join(base)}; {' '.join(pip)} --target {run.fisite} "
        f"{' '.join(fi)}; {' '.join(kit)} unpack-aot --wheels {wheels} --site {run.fisite} --json {work}/aot.json"
    )
    run.stage("install", ["bash", "-c", install], work / "aot.json")
    bench = [py, "benchmarks/engine/bench_gpu.py", "--random-weights", *tok, "--pair-dir", str(work / "random-pair")]
    bench += ["--quick", "--out", str(out / "bench"), *bench_extra]
    run.start_job("models", [*bench, "--prepare"], work / "models.log")
    addon = "import time; t = time.time(); import flashinfer; print(f'with the add-on: {time.time() - t:.1f} s')"
    env_job = [*kit, "check-env", "--wheels", str(wheels), "--site", str(work), "--json", str(work / "env.json")]
    run.start_job("env", env_job, work / "env.log", work / "env.json")
    # tvm-ffi builds its torch add-on once at the first import without TVM_FFI_DISABLE_TORCH_C_DLPACK
    run.start_job("tvm-ffi", ["env", "-u", "TVM_FFI_DISABLE_TORCH_C_DLPACK", py, "-c", addon], work / "tvm-ffi.log")

    rc = run.stage("preflight", [*kit, "preflight", "--json", str(work / "preflight.json")], work / "preflight.json")
    if rc == 1:
        run.fallbacks.append("preflight: a CUDA part failed (preflight.json); the engine may run without CUDA graphs")
    elif rc != 0:
        run.torch_backend("failed the pre-flight" if rc != -1 else "was not checked (no time left)")
    if run.attention == "flashinfer":
        rc = run.stage(
            "kernels", [*kit, "warm", "--part", "fa2", "--json", str(work / "warm-fa2.json")], work / "warm-fa2.json"
        )
        if rc != 0:
            run.torch_backend(f"could not load or build its page and FA2 kernels ({rc})")
    else:
        run.skip("kernels", "torch backend")
    prefill = ["--prefill-backend", "fa2"] if run.attention == "flashinfer" else []
    run.stage("decode", [*bench, *prefill, "--steps", "decode"], out / "bench" / "decode.json")
    timeout = lambda name: ["--step-timeout", str(max(10, int(min(STAGES[name][0], run.left()) - 10)))]  # noqa: E731
    run.stage("routed", [*bench, *prefill, "--steps", "routed", *timeout("routed")], out / "bench" / "summary.json")
    run.stage(
        "tests",
        [py, "-m", "pytest", "-m", "gpu", "tests/engine/attention/test_gpu_backend.py", "-p", "no:cacheprovider", "-q",
         "--junitxml", str(out / "pytest.xml")],
        note="the gpu tests, prefill on FA2" if run.attention == "flashinfer" else "the gpu tests, torch backend",
    )  # fmt: skip
    run.stage("single", [*bench, *prefill, "--steps", "single", *timeout("single")], out / "bench" / "summary.json")
    if run.attention == "flashinfer":
        run.stage("eager", [*bench, *prefill, "--steps", "eager", *timeout("eager")], out / "bench" / "summary.json")
        run.prefill = "fa3"  # the last stages: FA3's modules, then the routed engine with prefill on them
        rc = run.stage(
            "kernels-fa3",
            [*kit, "warm", "--part", "fa3", "--json", str(work / "warm-fa3.json")],
            work / "warm-fa3.json",
        )
        if rc in (0, -1):  # -1: kernels-fa3 had no time; then fa3 has none either, and says so
            run.stage("fa3", [*bench, "--steps", "fa3", *timeout("fa3")], out / "bench" / "summary.json")
        else:
            run.skip("fa3", "FA3's kernels did not load or build")
        run.stage(
            "report",
            [*kit, "jit-report", "--warm-json", str(work / "warm-fa2.json"), str(work / "warm-fa3.json"),
             "--prefill-backend", run.prefill, "--json", str(work / "jit.json")],
            work / "jit.json",
        )  # fmt: skip
    else:
        for name in ("eager", "kernels-fa3", "fa3", "report"):
            run.skip(name, "torch backend")
    for name in list(run.jobs):
        if not run.jobs[name].recorded:
            run.wait_job(name) if run.jobs[name].thread is None else run.finish_job(run.jobs[name])


def cmd_device_run(args) -> int:
    out = Path(args.out or os.environ.get("OUT") or ROOT / "gpu_out").resolve()
    work = Path(os.environ.get("GPU_KIT_WORK", "/tmp/gpu-kit")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    kill_at = os.environ.get("GPU_KIT_KILL_AT")
    fake = os.environ.get("GPU_KIT_FAKE_CLOCK") == "1"
    clock = FakeClock(float(kill_at) if kill_at else None) if fake else Clock()
    sim = Simulation.parse(os.environ.get("GPU_KIT_SIMULATE", ""), work / "commands.log")
    if fake and sim is None:
        raise SystemExit("GPU_KIT_FAKE_CLOCK needs GPU_KIT_SIMULATE: a fake clock runs only simulated stages")
    log = Log(out / "gpu_check.log")
    budget = float(os.environ.get("GPU_KIT_BUDGET_S", "420"))
    run = DeviceRun(out, work, budget, clock, sim, log)

    def on_term(signum, frame):  # the device tool's limit, or a person: record what was cut, take children along
        log(f"!! signal {signum} at {clock.now():.0f} s: stopping")
        for proc in list(RUNNING):
            kill_group(proc, grace=2)
        run.write_summary()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    log(f"gpu_check.sh: budget {budget:.0f} s, {os.cpu_count()} cores, {sys.version.split()[0]}, out {out}")
    run.write_summary()
    plan(run, ROOT / ".whl", (os.environ.get("GPU_KIT_BENCH_ARGS") or "").split())
    run.finished = True
    run.write_summary()
    from .run_table import table

    for line in table(out):
        log(line)
    return 0
