"""Every script under benchmarks/ is run by the suite, so a change that breaks one fails here: on the
tests' tiny pair in seconds where it can run on it, else its `--help` (its imports and options) where
a run needs what the suite does not have (the demo pair, llama-cpp-python, a GPU, Ray, minutes), or
an import for the modules a script is made of. The runs are in this process (script_runs.py)."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.benchmarks.script_runs import run_script
from tokenrouter.engine import native

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Run:
    """Run with `args` ({small}, {large}: the tiny pair's directories; {out}: a fresh folder): it must
    exit 0 and write each of `writes` under {out} (JSON files must parse). `c_kernels`: it times the
    package's C kernels, so it needs a C compiler (as their own tests do)."""

    args: str
    writes: tuple[str, ...]
    c_kernels: bool = False


@dataclass(frozen=True)
class Help:
    """Only `--help`: a run needs `needs`."""

    needs: str


@dataclass(frozen=True)
class Imported:
    """A module of a script (`part_of`), or one whose only entry point reads a job on stdin: imported."""

    part_of: str


@dataclass(frozen=True)
class OwnTest:
    """Run on the tiny pair by a test of its own."""

    test: str


DEMO = "the demo pair from the store"
LLAMA = "llama-cpp-python and the demo pair's GGUF files"
TINY = "--small {small} --large {large}"

SMOKE: dict[str, Run | Help | Imported | OwnTest] = {
    "bench_log.py": Imported("anchors/bench_single.py"),
    # anchors/
    "anchors/bench_cpu_anchor.py": Help(LLAMA),
    "anchors/llama_cpp_rounds.py": Imported("anchors/bench_cpu_anchor.py (run with a job on stdin)"),
    "anchors/bench_default_engine.py": Help("Engine()'s default models from the store"),
    "anchors/readme_first_run.py": Help("a clone of the checkout, README's setup and its downloads"),
    "anchors/readme_second_run.py": Help("scripts/setup.sh and the demo pair in the store"),
    "anchors/bench_single.py": Run(
        "--model {large} --concurrency 2 --num-prompts 2 --max-tokens 4 --repeats 1 --warmup-prompts 1 "
        "--warmup-tokens 2 --min-prompt-tokens 8 --max-prompt-tokens 24 --kv-cache-tokens 1024 "
        "--json {out}/single.json",
        ("single.json",),
    ),
    "anchors/single_workload.py": Imported("anchors/bench_single.py"),
    "anchors/single_runs.py": Imported("anchors/bench_single.py"),
    "anchors/single_report.py": Imported("anchors/bench_single.py"),
    "anchors/engine_runs.py": Imported("anchors/bench_single.py"),
    "anchors/hf_baselines.py": Imported("anchors/bench_single.py"),
    "anchors/token_agreement.py": Imported("anchors/bench_single.py"),
    "anchors/py_spy_profile.py": Imported("anchors/bench_single.py --profile, which needs py-spy"),
    # kernels/
    "kernels/bench_cpu_levels.py": Help("a build of the kernels at every CPU level (minutes)"),
    "kernels/bench_gguf_blocks.py": Help("the probe's timings on the 1.5B model's shapes (a minute)"),
    "kernels/bench_linear_kernels.py": Help(DEMO),
    "kernels/bench_cpu_attention.py": Run("--quick --json {out}/attention.json", ("attention.json",), c_kernels=True),
    "kernels/bench_gqa_attention.py": Run("--quick --json {out}/gqa.json", ("gqa.json",)),
    "kernels/bench_decode_step.py": OwnTest("tests/test_bench_decode_step.py"),
    "kernels/step_breakdown.py": Help(DEMO),
    "kernels/ggml_step_breakdown.py": Help(LLAMA),
    "kernels/bench_batch_invariance.py": Help("the demo pair's shapes and models (minutes)"),
    "kernels/bench_huge_pages.py": Run(
        "--model '' --copies 1 --rounds 1 --json {out}/huge-pages.json", ("huge-pages.json",), c_kernels=True
    ),
    "kernels/bench_threads.py": Help(DEMO),
    "kernels/openmp_threads.py": Help(DEMO),
    # engine/
    "engine/bench_routing.py": Run(
        f"{TINY} --tau 0.2 --concurrency 2 --requests 2 --repeats 1 --max-tokens 4 --systems routed large "
        "--kv-cache-tokens 1024 --json {out}/routing.json",
        ("routing.json",),
    ),
    "engine/bench_speculative.py": Run(
        f"{TINY} --k 2 --systems large speculative --concurrency 1 --min-requests 1 --repeats 1 --max-tokens 4 "
        "--kv-cache-tokens 1024 --json {out}/speculative.json",
        ("speculative.json",),
    ),
    "engine/speculative_probe.py": Help(DEMO),
    "engine/bench_prompt_lookup.py": Help(LLAMA),
    "engine/bench_distributed.py": Help("a Ray cluster"),
    "engine/bench_load_memory.py": Help(DEMO),
    "engine/bench_model_forms.py": Help(DEMO),
    "engine/bench_openai_overhead.py": Run(
        f"{TINY} --max-tokens 4 --rounds 1 --json {{out}}/overhead.json", ("overhead.json",)
    ),
    "engine/bench_structured.py": Run(
        "--quick --concurrency 1 --max-tokens 4 --json {out}/structured.json", ("structured.json",)
    ),
    "engine/bench_throughput_model.py": Help("Engine()'s default models and minutes of load"),
    "engine/bench_gpu.py": Run(
        "--random-weights --tiny --prepare --out {out}",
        ("random-pair/small/config.json", "random-pair/large/config.json"),
    ),
    # quality/
    "quality/fused_agreement.py": Help(DEMO),
    "quality/precision_agreement.py": Help(DEMO),
    "quality/speculative_agreement.py": Run(
        f"{TINY} --tasks 1 --max-tokens 4 --int8 --out {{out}}/agreement.jsonl", ("agreement.jsonl",)
    ),
    "quality/router_quality.py": Help("routers trained on labels of the demo pair"),
    "quality/calibrate_scripted_router.py": Help(DEMO),
    "quality/humaneval_llama_cpp.py": Help(LLAMA),
    "quality/bench_gguf_types.py": Help(LLAMA),
}


def scripts() -> set[str]:
    return {
        p.relative_to(BENCHMARKS).as_posix()
        for p in BENCHMARKS.rglob("*.py")
        if "results" not in p.relative_to(BENCHMARKS).parts and p.name != "__init__.py"
    }


def of(kind) -> list[str]:
    return sorted(name for name, how in SMOKE.items() if isinstance(how, kind))


def test_every_script_has_a_smoke_test():
    assert scripts() == set(SMOKE), (
        f"no smoke test: {sorted(scripts() - set(SMOKE))}; listed but gone: {sorted(set(SMOKE) - scripts())}"
    )


@pytest.mark.parametrize("name", of(Run))
def test_the_script_runs_on_the_tiny_pair(name, tiny_pair, tmp_path, capsys):
    how = SMOKE[name]
    if how.c_kernels and native.compiler() is None:
        pytest.skip("no C compiler")
    args = shlex.split(how.args.format(small=tiny_pair["small"], large=tiny_pair["large"], out=tmp_path))
    status = run_script(BENCHMARKS / name, args)
    out = capsys.readouterr()
    assert status == 0, f"{name} exited {status!r}:\n{out.out[-3000:]}\n{out.err[-3000:]}"
    for written in how.writes:
        path = tmp_path / written
        assert path.is_file(), f"{name} wrote no {written}"
        if path.suffix == ".json":
            assert json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            assert [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", of(Help))
def test_the_script_answers_help(name, capsys):
    status = run_script(BENCHMARKS / name, ["--help"])
    out = capsys.readouterr()
    assert status == 0 and out.out.startswith("usage:"), f"{name} --help exited {status!r}:\n{out.out}\n{out.err}"


@pytest.mark.parametrize("name", of(Imported))
def test_the_module_imports(name):
    module = importlib.import_module("benchmarks." + name.removesuffix(".py").replace("/", "."))
    assert module.__doc__, f"{name} says in no docstring what it is"


@pytest.mark.parametrize("name", of(OwnTest))
def test_its_own_test_runs_it(name):
    assert f"benchmarks/{name}" in (ROOT / SMOKE[name].test).read_text()


def test_a_script_run_as_a_file_finds_the_other_folders(tmp_path):
    """As a user runs them: a fresh Python, started elsewhere, with nothing on PYTHONPATH; the script
    puts the checkout on sys.path itself to import `benchmarks.kernels.bench_gqa_attention`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = BENCHMARKS / "kernels" / "bench_cpu_attention.py"
    done = subprocess.run([sys.executable, script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-3000:]
