"""`tokenrouter eval` end to end from Python, on the tiny model pair of --quick and the
hand-written problems of test_eval.py (no network): the whole pipeline, resuming an interrupted
run, subsets, bad arguments, the report from results.jsonl alone."""

import argparse
import os
import signal
import threading
import time

import pytest

from tests.eval.test_eval import PROBLEMS, write_problems
from tokenrouter.cli import eval_command as command
from tokenrouter.eval import ResultsFile


def parse(argv):
    parser = argparse.ArgumentParser(prog="tokenrouter")
    sub = parser.add_subparsers(dest="command", required=True)
    command.add_parser(sub)
    return parser.parse_args(["eval", *argv])


def run(argv, say=None):
    lines = []
    rc = command.run(parse(argv), say=say or lines.append, argv=["eval", *argv])
    return rc, lines


@pytest.fixture
def data(tmp_path):
    return write_problems(tmp_path / "toy.jsonl")


def problems(out):
    return {(r["system"], r["task_id"]): r for r in ResultsFile(out / "results.jsonl").read() if r["type"] == "problem"}


def test_quick_runs_the_whole_pipeline(tmp_path, data, capsys):
    out = tmp_path / "quick"
    rc, lines = run(["--quick", "--data", str(data), "--out", str(out)])
    assert rc == 0, lines
    records = ResultsFile(out / "results.jsonl").read()
    assert records[0]["type"] == "run" and records[0]["max_tokens"] == 24
    done = problems(out)
    assert set(done) == {(s, p.task_id) for s in ("small", "large", "rstitch:0.2") for p in PROBLEMS}
    for r in done.values():
        assert r["status"] in ("passed", "failed", "syntax_error", "timeout")
        assert r["output_tokens"] == sum(r["tokens_by_model"].values()) > 0
        assert set(r["tokens_processed"]) <= {"small", "large"}
    assert {r["system"] for r in records if r["type"] == "speed"} == {"small", "large", "rstitch:0.2"}
    routed = [r for (s, _), r in done.items() if s == "rstitch:0.2"]
    assert sum(r["handoffs"] for r in routed) > 0  # the tiny pair routes both ways at 0.2
    md = (out / "results.md").read_text()
    assert "| rstitch:0.2 |" in md and "| large | 0.000 | 0/3 | 24 | 0%/100% |" in md
    systems = [r for r in records if r["type"] == "system" and r["system"] == "large"]
    kernel = systems[0]["linear_kernel"]["large"]  # as the engine loaded it, named in the report
    assert kernel and f"computed in float32 (linear layers: {kernel})" in md
    assert (out / "pareto.png").stat().st_size > 0
    assert "| system | pass@1 |" in capsys.readouterr().out
    # The report is made from results.jsonl alone.
    (out / "results.md").unlink()
    rc, _ = run(["--report-only", "--out", str(out)])
    assert rc == 0 and (out / "results.md").read_text() == md


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt, as under a terminal. A shell starts background jobs with
    SIGINT ignored, and Python then installs no handler: a SIGINT would be dropped."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path, data, ctrl_c_raises):
    common = [
        "--quick",
        "--data",
        str(data),
        "--systems",
        "small",
        "rstitch:0.2",
        "--concurrency",
        "1",
        "--speed-requests",
        "0",
    ]
    ref = tmp_path / "ref"
    assert run([*common, "--out", str(ref)])[0] == 0
    out = tmp_path / "resumed"
    # Ctrl-C after the second problem of the first system: what ended is on disk.
    seen = []

    def say(line):
        if line.startswith("[small] Toy/"):
            seen.append(line)
            if len(seen) == 2:
                os.kill(os.getpid(), signal.SIGINT)

    threads = threading.active_count()
    rc, _ = run([*common, "--out", str(out)], say=say)
    assert rc == 130
    deadline = time.monotonic() + 10  # the engine was closed on the way out: its threads end
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    # Toy/2 may have ended too: it generates while Toy/1 is tested in the sandbox, and a test that
    # is running when the interrupt comes is finished and recorded on the way out.
    on_disk = set(problems(out))
    assert {("small", "Toy/0"), ("small", "Toy/1")} <= on_disk <= {("small", p.task_id) for p in PROBLEMS}
    # Refused without --resume, and with another configuration.
    rc, lines = run([*common, "--out", str(out)])
    assert rc == 2 and "pass --resume" in lines[-1]
    rc, lines = run([*common, "--out", str(out), "--resume", "--max-tokens", "8"])
    assert rc == 2 and "max_tokens: 24 there, 8 now" in lines[-1]
    rc, lines = run(
        [*common, "--out", str(out), "--resume", "--data", str(write_problems(tmp_path / "two.jsonl", PROBLEMS[:2]))]
    )
    assert rc == 2 and "data:" in lines[-1]
    # Resumed: only what was missing runs, and the results are those of an uninterrupted run.
    rc, lines = run([*common, "--out", str(out), "--resume"])
    assert rc == 0, lines
    missing = sorted({("small", p.task_id) for p in PROBLEMS} - on_disk)
    if missing:
        assert any(f"{len(missing)} problem(s) to run ({3 - len(missing)} already done)" in line for line in lines)
    else:
        assert any("small: every problem done" in line for line in lines), lines
    ran = [line for line in lines if line.startswith("[small] Toy/")]
    assert [line.split(":")[0] for line in ran] == [f"[small] {t}" for _, t in missing]
    records = ResultsFile(out / "results.jsonl").read()
    keys = [(r["system"], r["task_id"]) for r in records if r["type"] == "problem"]
    assert len(keys) == len(set(keys)) == 6
    got, want = problems(out), problems(ref)
    assert set(got) == set(want)
    fields = ("completion", "status", "passed", "tokens_by_model", "handoffs", "output_tokens")
    for key in want:
        assert {f: got[key][f] for f in fields} == {f: want[key][f] for f in fields}, key
    # Everything is done: a further resume runs nothing.
    rc, lines = run([*common, "--out", str(out), "--resume"])
    assert rc == 0 and sum("skipped" in line for line in lines) == 2


def test_problems_and_limit_choose_a_subset(tmp_path, data):
    base = ["--quick", "--data", str(data), "--systems", "small", "--speed-requests", "0"]
    out = tmp_path / "some"
    assert run([*base, "--problems", "Toy/2,Toy/0", "--out", str(out)])[0] == 0
    assert set(problems(out)) == {("small", "Toy/0"), ("small", "Toy/2")}
    out = tmp_path / "first"
    assert run([*base, "--limit", "1", "--out", str(out)])[0] == 0
    assert set(problems(out)) == {("small", "Toy/0")}


def test_speed_rounds_take_turns_and_a_resume_runs_only_the_rounds_owed(tmp_path, data):
    out = tmp_path / "rounds"
    common = ["--quick", "--data", str(data), "--systems", "small", "large", "--limit", "1", "--out", str(out)]

    def speed_order():
        return [r["system"] for r in ResultsFile(out / "results.jsonl").read() if r["type"] == "speed"]

    assert run([*common, "--speed-rounds", "2"])[0] == 0
    assert speed_order() == ["small", "large", "small", "large"]  # round by round, not one system's runs back to back
    rc, lines = run([*common, "--resume", "--speed-rounds", "3"])
    assert rc == 0, lines
    assert speed_order() == ["small", "large"] * 3
    assert not any("problem(s) to run" in line and "0 problem" not in line for line in lines)  # no answer again
    assert "the median of 3 runs per system" in (out / "results.md").read_text()
    rc, lines = run([*common, "--resume", "--speed-rounds", "3"])
    assert rc == 0 and sum("skipped" in line for line in lines) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--systems", "rstitch:2"], "system 'rstitch:2': tau: must be in [0, 1], got 2"),
        (["--systems", "r2r:0.3"], "system 'r2r:0.3': router: r2r needs a router"),
        (["--systems", "nope"], "system 'nope': kind: unknown 'nope'"),
        (["--systems", "single:medium"], "models: needs model(s) ['medium']"),
        (["--problems", "Toy/7"], "problems: unknown task_id 'Toy/7'"),
        (["--small", "/nonexistent"], "--quick builds its own tiny model pair"),
        (["--resume"], "--resume needs --out DIR"),
        (["--speed-rounds", "101"], "--speed-rounds: Input should be less than or equal to 100"),
    ],
)
def test_bad_arguments_print_one_line_and_exit_2(tmp_path, data, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, lines = run(["--quick", "--data", str(data), *argv])
    assert rc == 2
    assert message in lines[-1] and lines[-1].startswith("tokenrouter eval: error: ")
    assert list(tmp_path.iterdir()) == [data]  # refused before anything was built or written


def test_bad_models_and_report_dirs(tmp_path, data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, lines = run(["--data", str(data), "--small", str(tmp_path / "nothing"), "--no-pull"])
    assert rc == 2 and "no such file or directory" in lines[-1]
    rc, lines = run(["--report-only", "--out", str(tmp_path)])
    assert rc == 2 and "no results.jsonl" in lines[-1]
    rc, lines = run(["--report-only"])
    assert rc == 2 and "--report-only needs --out" in lines[-1]


def test_the_parser_follows_the_clis_convention(tmp_path, data):
    args = parse(["--quick", "--data", str(data), "--systems", "bogus", "--out", str(tmp_path / "o")])
    assert args.command == "eval" and args.run(args, ["eval"]) == 2  # tokenrouter.cli calls args.run(args, argv)


def test_argparse_rejects_bad_numbers():
    with pytest.raises(SystemExit):
        parse(["--concurrency", "0"])
    with pytest.raises(SystemExit):
        parse(["--timeout", "-1"])


def test_the_tokenrouter_command_runs_eval_quick(tmp_path, capsys):
    """`tokenrouter eval --quick` through the CLI's own entry point (what a user types)."""
    from tokenrouter import cli

    code = cli.main(["eval", "--quick", "--out", str(tmp_path / "q")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (tmp_path / "q" / "results.jsonl").is_file() and (tmp_path / "q" / "results.md").is_file()
    assert "pass@1" in out
