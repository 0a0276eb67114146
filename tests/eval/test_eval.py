"""tokenrouter eval's parts: problems files, the prompt and code extraction, system specs, the
results file, FLOPs, the report. The hand-written problems here (HumanEval's format) are reused
by the command's tests, so nothing needs the network."""

import gzip
import json
from pathlib import Path

import pytest

from tokenrouter.errors import ConfigError
from tokenrouter.eval import Limits, Problem, load_problems, markdown, run_program, select, summarize
from tokenrouter.eval.flops import flops_per_token, parameter_counts
from tokenrouter.eval.label_placement import LABEL_SLOTS, label_box, place_labels
from tokenrouter.eval.pareto import pareto_front
from tokenrouter.eval.prompt import INSTRUCTION, RESPONSE_PREFIX, build_program, extract_code, prompt_ids
from tokenrouter.eval.results import ResultsFile, check_resumable, portable
from tokenrouter.eval.systems import SpecError, parse_system, parse_systems
from tokenrouter.policies import BiLD, RStitch, Single, Speculative

ADD = Problem(
    task_id="Toy/0",
    prompt='def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    """\n',
    entry_point="add",
    canonical_solution="    return a + b\n",
    test="\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
)
# A helper function defined in the prompt, which the solution needs (like HumanEval/10 and /38).
COUNT_EVEN = Problem(
    task_id="Toy/1",
    prompt=(
        "def is_even(n: int) -> bool:\n    return n % 2 == 0\n\n\n"
        'def count_even(xs: list) -> int:\n    """Count the even numbers in xs, with is_even.\n'
        '    >>> count_even([1, 2, 4])\n    2\n    """\n'
    ),
    entry_point="count_even",
    canonical_solution="    return sum(1 for x in xs if is_even(x))\n",
    test=(
        "\n\ndef check(candidate):\n    assert candidate([1, 2, 4]) == 2\n"
        "    assert candidate([]) == 0\n    assert candidate([3]) == 0\n"
    ),
)
# Imports in the prompt, as most HumanEval problems have.
LONGEST = Problem(
    task_id="Toy/2",
    prompt=(
        "from typing import List, Optional\n\n\n"
        'def longest(strings: List[str]) -> Optional[str]:\n    """The first longest string; None for an empty list.\n'
        "    >>> longest(['a', 'bb', 'cc'])\n    'bb'\n    \"\"\"\n"
    ),
    entry_point="longest",
    canonical_solution="    if not strings:\n        return None\n    return max(strings, key=len)\n",
    test=(
        "\n\ndef check(candidate):\n    assert candidate([]) is None\n    assert candidate(['a', 'bb', 'cc']) == 'bb'\n"
        "    assert candidate(['x']) == 'x'\n"
    ),
)
PROBLEMS = [ADD, COUNT_EVEN, LONGEST]


def write_problems(path: Path, problems=PROBLEMS) -> Path:
    lines = "".join(json.dumps(p.__dict__) + "\n" for p in problems)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines)
    return path


LIMITS = Limits(timeout_s=5)


# ---- problems ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["toy.jsonl", "toy.jsonl.gz"])
def test_a_problems_file_loads_gzipped_or_not(tmp_path, name):
    assert load_problems(write_problems(tmp_path / name)) == PROBLEMS


def test_a_bad_problems_file_names_the_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ADD.__dict__) + "\n" + json.dumps({**COUNT_EVEN.__dict__, "test": 3}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: field 'test' must be a string"):
        load_problems(bad)
    bad.write_text(json.dumps(ADD.__dict__) + "\n" + json.dumps(ADD.__dict__) + "\n")
    with pytest.raises(ConfigError, match="appears twice"):
        load_problems(bad)
    with pytest.raises(ConfigError, match="no such file|cannot read"):
        load_problems(tmp_path / "missing.jsonl")


def test_select_by_id_and_limit():
    assert select(PROBLEMS, limit=2) == PROBLEMS[:2]
    assert select(PROBLEMS, ids=["Toy/2", "Toy/0"]) == [ADD, LONGEST]  # the file's order
    with pytest.raises(ConfigError, match="unknown task_id 'Toy/9'"):
        select(PROBLEMS, ids=["Toy/9"])


# ---- prompt, extraction, program -----------------------------------------------------------
def test_the_prompt_opens_the_answer_in_a_code_block(tokenizer):
    text = tokenizer.decode(prompt_ids(tokenizer, COUNT_EVEN))
    assert text.endswith("<|im_start|>assistant\n" + RESPONSE_PREFIX)
    assert text.startswith("<|im_start|>user\n" + INSTRUCTION + "\n```\n" + COUNT_EVEN.prompt.strip() + "\n```")


def test_extract_code_stops_at_a_fence_and_drops_a_repeated_opening():
    assert extract_code("def f():\n    return 1\n```\nprose") == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"


FULL = "def add(a, b):\n    return a + b\n"
HELPER_USING = (
    "from math import fsum\n\n@staticmethod\ndef unused():\n    pass\n\n"
    "def count_even(xs):\n    return sum(1 for x in xs if is_even(x))\n\n"
    "# Example usage\nprint(count_even([1, 2]))\nif __name__ == '__main__':\n    input()\nwhile True:\n    pass\n"
)


@pytest.mark.parametrize(
    "problem, completion, mode",
    [
        (ADD, FULL, "definition"),
        (ADD, "    return a + b\n", "body"),  # only the body: it continues the prompt's signature
        (COUNT_EVEN, HELPER_USING, "definition"),  # needs the prompt's helper; its demo code is dropped
        (LONGEST, "def longest(strings):\n    return max(strings, key=len) if strings else None\n", "definition"),
        (LONGEST, LONGEST.canonical_solution, "body"),
    ],
    ids=["full", "body", "helper-in-prompt", "imports-in-prompt", "canonical"],
)
def test_programs_from_answers_pass(problem, completion, mode):
    program = build_program(problem, completion)
    assert program.mode == mode
    out = run_program(program.code, LIMITS)
    assert out.status == "passed", (out, program.code)


def test_demo_code_in_an_answer_is_not_run():
    program = build_program(COUNT_EVEN, HELPER_USING)
    assert "print(" not in program.code and "input()" not in program.code and "while True" not in program.code
    assert "from math import fsum" in program.code and "@staticmethod" in program.code


@pytest.mark.parametrize(
    "completion, status",
    [
        ("def add(a, b):\n    return a - b\n", "failed"),
        ("def add(a, b:\n    return a + b\n", "syntax_error"),
        ("def add(a, b):\n    while True:\n        pass\n", "timeout"),
        ("def plus(a, b):\n    return a + b\n", "failed"),  # the entry point is still the prompt's stub
        ("", "failed"),
    ],
)
def test_wrong_answers_fail(completion, status):
    out = run_program(build_program(ADD, completion).code, Limits(timeout_s=1.5))
    assert out.status == status, out


# ---- system specs --------------------------------------------------------------------------
MODELS = ["small", "large"]


def test_specs_make_systems():
    systems = parse_systems(["small", "large", "rstitch:0.01,0.1", "rstitch", "mine=single:small"], MODELS)
    assert [s.label for s in systems] == ["small", "large", "rstitch:0.01", "rstitch:0.1", "rstitch:0.03", "mine"]
    assert [s.models for s in systems][:3] == [("small",), ("large",), ("small", "large")]
    assert isinstance(systems[0].make(), Single) and systems[1].make().model == "large"
    policy = systems[3].make()
    assert isinstance(policy, RStitch) and policy.tau == 0.1
    assert systems[5].single_model == "small"


def test_verifying_specs_make_speculative_and_bild_systems():
    systems = parse_systems(["speculative", "speculative:2,8", "bild:0.6/5,0.8/3"], MODELS)
    assert [s.label for s in systems] == [
        "speculative:auto",
        "speculative:2",
        "speculative:8",
        "bild:0.6/5",
        "bild:0.8/3",
    ]
    spec = systems[2].make()
    assert isinstance(spec, Speculative) and spec.k == 8 and systems[0].make().k == "auto"
    bild = systems[4].make()
    assert isinstance(bild, BiLD) and (bild.fallback, bild.rollback) == (0.8, 3.0)
    assert all(s.models == ("small", "large") for s in systems)


def factory():
    return RStitch(tau=0.5)


def test_an_import_path_spec_builds_the_users_policy():
    (s,) = parse_system("tests.eval.test_eval:factory", MODELS)
    assert s.kind == "custom" and s.label == "tests.eval.test_eval:factory" and s.make().tau == 0.5
    (s,) = parse_system("half=tests.eval.test_eval:factory", MODELS)
    assert s.label == "half"


@pytest.mark.parametrize(
    "spec, field, message",
    [
        ("rstitch:abc", "tau", "expected a number in [0, 1], got 'abc'"),
        ("rstitch:1.5", "tau", "must be in [0, 1]"),
        ("rstitch:0.1,0.1", "tau", "given twice"),
        ("r2r:0.3", "router", "needs a router"),
        ("citer@/nonexistent/router", "router", "no such directory"),
        ("rstitch@somewhere", "router", "takes no router"),
        ("small:0.1", "kind", "takes no value"),
        ("single:medium", "models", "needs model(s) ['medium']"),
        ("bogus", "kind", "expected one of small, large, single, rstitch, r2r, citer, collm, speculative, bild"),
        ("speculative:0", "k", "must be in [1, 64]"),
        ("speculative:four", "k", "or auto, got 'four'"),
        ("speculative:4,4", "k", "given twice"),
        ("bild", "point", "give FALLBACK/ROLLBACK"),
        ("bild:0.6", "point", "expected FALLBACK/ROLLBACK"),
        ("bild:1.5/3", "fallback", "must be in [0, 1]"),
        ("bild:0.5/0", "rollback", "must be > 0"),
        ("bild@somewhere", "router", "takes no router"),
        ("no_such_module_here:make", "module", "cannot import"),
        ("tests.eval.test_eval:nothing", "factory", "has no attribute"),
        ("tests.eval.test_eval:MODELS", "factory", "must return a tokenrouter Policy"),
        ("a b=small", "label", "may hold only"),
        ("x=rstitch:0.1,0.2", "label", "names one system"),
        ("", "spec", "is empty"),
    ],
)
def test_bad_specs_name_the_field(spec, field, message):
    with pytest.raises(SpecError) as info:
        parse_system(spec, MODELS)
    assert info.value.field == field
    assert message in str(info.value)
    assert repr(spec.strip()) in str(info.value)


def test_a_router_that_is_not_a_router_is_refused(tmp_path):
    with pytest.raises(SpecError, match="router"):
        parse_system(f"r2r@{tmp_path}", MODELS)


def test_a_label_given_twice_is_refused():
    with pytest.raises(SpecError, match="already a system"):
        parse_systems(["rstitch:0.03", "rstitch"], MODELS)


# ---- results file --------------------------------------------------------------------------
def test_a_line_cut_short_is_ignored_and_removed_before_the_next_append(tmp_path):
    rf = ResultsFile(tmp_path / "results.jsonl")
    rf.append({"type": "run", "n": 1})
    rf.append({"type": "problem", "n": 2})
    with open(rf.path, "a") as f:
        f.write('{"type": "problem", "n"')  # a crash mid-write
    assert [r["n"] for r in rf.read()] == [1, 2]
    rf.append({"type": "problem", "n": 3})
    assert [r["n"] for r in rf.read()] == [1, 2, 3]
    assert rf.path.read_text().count("\n") == 3


def test_a_bad_line_in_the_middle_is_an_error(tmp_path):
    rf = ResultsFile(tmp_path / "results.jsonl")
    rf.path.write_text('{"type": "run"}\nnot json\n{"type": "problem"}\n')
    with pytest.raises(ConfigError, match="results.jsonl:2"):
        rf.read()


def test_resuming_needs_the_same_configuration(tmp_path):
    run = {
        "format": 1,
        "prompt_version": 1,
        "max_tokens": 512,
        "data": {"fingerprint": "d", "source": "a"},
        "sandbox": {"timeout_s": 10.0, "memory_bytes": 1},
        "models": {"small": {"fingerprint": "s", "path": "/x"}},
    }
    moved = {**run, "models": {"small": {"fingerprint": "s", "path": "/elsewhere"}}, "data": {"fingerprint": "d"}}
    check_resumable(tmp_path, run, moved)  # where the models and data are does not matter
    with pytest.raises(ConfigError, match=r"max_tokens: 512 there, 256 now"):
        check_resumable(tmp_path, run, {**run, "max_tokens": 256})
    with pytest.raises(ConfigError, match=r"models.small: \"s\" there, \"t\" now"):
        check_resumable(tmp_path, run, {**run, "models": {"small": {"fingerprint": "t"}}})
    with pytest.raises(ConfigError, match="prompt_version"):
        check_resumable(tmp_path, run, {**run, "prompt_version": 2})
    with pytest.raises(ConfigError, match=r"precision: \"auto\" there, \"float32\" now"):
        check_resumable(tmp_path, {**run, "precision": "auto"}, {**run, "precision": "float32"})


def test_records_name_no_place_of_this_machine(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TOKENROUTER_HOME", str(home / ".cache" / "tokenrouter"))
    monkeypatch.setenv("HOME", str(home))
    work = home / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    command = f"tokenrouter eval --systems r=r2r:0.8@{work}/routers/r2r --model large={home}/models/x --out {work}/o"
    assert portable(command) == "tokenrouter eval --systems r=r2r:0.8@routers/r2r --model large=~/models/x --out o"
    assert portable(home / ".cache" / "tokenrouter" / "models" / "m") == "$TOKENROUTER_HOME/models/m"


# ---- FLOPs and the report -------------------------------------------------------------------
def test_flops_count_every_weight_that_multiplies_a_token(tiny_pair):
    c = parameter_counts(tiny_pair["small"])
    assert c["embedding"] == 384 * 64 and c["head"] == 384 * 64  # untied
    assert flops_per_token(tiny_pair["small"]) == 2 * (c["total"] - c["embedding"])


def test_place_labels_keeps_labels_apart():
    right, below, left = LABEL_SLOTS[0], LABEL_SLOTS[1], LABEL_SLOTS[2]
    room = (-1000.0, -1000.0, 1000.0, 1000.0)
    # two points on one spot (as RStitch(0.01) and BiLD(0.9/2) at 1.32, 0.689): the second label
    # goes below the first; a point far off keeps the first choice
    assert place_labels([(0, 0), (0, 0), (500, 500)], [(50, 10)] * 3, room) == [right, below, right]
    # a label that would run out of the axes goes to the left of its point
    assert place_labels([(980, 0)], [(50, 10)], room) == [left]
    # a label that would cover the legend, or another point, goes elsewhere
    assert place_labels([(0, 0)], [(50, 10)], room, obstacles=[(20, 0, 80, 20)]) == [below]
    assert place_labels([(0, 0), (20, 6)], [(50, 10), (10, 10)], room)[0] == below
    # with no free slot, the one that overlaps least: an obstacle over everything from 7 above the
    # lowest slot's bottom up leaves only the lowest slots partly free, and the first of them wins
    lowest = min(LABEL_SLOTS, key=lambda slot: slot[1])
    floor = lowest[1]
    slots = place_labels([(0, 0)], [(50, 10)], room, obstacles=[(-1000, floor + 7, 1000, 1000)])
    assert slots == [lowest] and label_box((0, 0), (50, 10), slots[0]) == (5, floor, 55, floor + 10)
    assert place_labels([], [], room) == []


def test_pareto_front():
    # (cost, pass@1): lower cost and higher pass are better
    pts = [(1.0, 0.7), (0.3, 0.6), (0.5, 0.55), (0.6, 0.7), (0.3, 0.6)]
    assert pareto_front(pts, lower_x_better=True) == [1, 3, 4]
    assert pareto_front([(10.0, 0.5), (20.0, 0.4), (5.0, 0.6)], lower_x_better=False) == [0, 1, 2]


def _record(system, task, passed, small, large, processed):
    return {
        "type": "problem",
        "system": system,
        "task_id": task,
        "passed": passed,
        "status": "passed" if passed else "failed",
        "tokens_by_model": {k: v for k, v in (("small", small), ("large", large)) if v},
        "tokens_processed": processed,
        "handoffs": 1,
        "steps_delta": {"small": 2},
    }


def test_the_summary_from_records_alone():
    run = {
        "type": "run",
        "prompt_version": 1,
        "max_tokens": 8,
        "data": {"source": "toy", "problems": 5},
        "sandbox": {"timeout_s": 10},
        "models": {
            "small": {"flops_per_token": 1, "description": "s", "parameters": 1},
            "large": {"flops_per_token": 3, "description": "l", "parameters": 3},
        },
    }
    records = [
        run,
        {"type": "system", "system": "large", "kind": "large", "models": ["large"], "policy": "Single('large')"},
        _record("large", "a", True, 0, 10, {"large": 100}),
        _record("large", "b", True, 0, 10, {"large": 100}),
        {"type": "system", "system": "r", "kind": "rstitch", "models": ["small", "large"], "policy": "RStitch()"},
        _record("r", "a", True, 8, 2, {"small": 100, "large": 50}),
        _record("r", "a", False, 8, 2, {"small": 100, "large": 50}),  # a re-run: the last record wins
        {
            "type": "speed",
            "system": "r",
            "tok_per_s": 5.0,
            "p50_s": 2.0,
            "concurrency": 4,
            "requests": 8,
            "date": "2026-12-01T00:00:00Z",
            "machine": {"cpu": "x", "cpu_count": 2},
        },
    ]
    s = summarize(records)
    assert s.reference == "large"
    large, routed = s.rows
    assert (large.n, large.passed, large.relative_cost) == (2, 2, 1.0)
    assert (routed.n, routed.passed) == (1, 0)
    assert routed.relative_cost == pytest.approx((100 * 1 + 50 * 3) / 300)  # over problem "a" only
    assert routed.share("small") == 0.8
    md = markdown(s)
    assert "| r | 0.000 | 0/1 | 10 | 80%/20% |" in md and "| 0.83 | 5.00 | 2.00 |" in md
    assert "Still running (pass@1 over the problems finished so far; left out of pareto.png): r (1 of 2)." in md
    assert [r.system for r in s.plotted()] == ["large"]  # r has 1 of the 2 problems: not the same work
    assert "large (" not in md  # a --limit run: 2 of the file's 5, finished, not still running
    records.append(
        {"type": "system", "system": "later", "kind": "rstitch", "models": ["small", "large"], "policy": "RStitch()"}
    )
    md = markdown(summarize(records))
    assert "| later |" not in md and "Not run yet: later." in md


def test_speed_is_the_median_of_the_runs_at_the_latest_setting():
    def speed(tok_per_s, p50_s, concurrency=4):
        return {
            "type": "speed",
            "system": "r",
            "tok_per_s": tok_per_s,
            "p50_s": p50_s,
            "concurrency": concurrency,
            "requests": 8,
            "date": "2026-12-01T00:00:00Z",
            "machine": {"cpu": "x", "cpu_count": 2},
        }

    run = {
        "type": "run",
        "prompt_version": 1,
        "max_tokens": 8,
        "data": {"source": "toy", "problems": 1},
        "sandbox": {"timeout_s": 10},
        "models": {"small": {"flops_per_token": 1, "description": "s", "parameters": 1}},
    }
    records = [
        run,
        {"type": "system", "system": "r", "kind": "single", "models": ["small"], "policy": "Single('small')"},
        _record("r", "a", True, 8, 0, {"small": 10}),
        speed(99.0, 0.1, concurrency=1),  # another setting, measured earlier: not the same work
        speed(4.0, 3.0),
        speed(6.0, 1.0),
        speed(5.0, 9.0),
    ]
    s = summarize(records)
    sp = s.rows[0].speed
    assert (sp.concurrency, len(sp.runs), sp.tok_per_s, sp.p50_s) == (4, 3, 5.0, 3.0)
    md = markdown(s)
    assert "| 5.00 (4.0-6.0) | 3.00 |" in md and "the median of 3 runs per system" in md
    assert summarize(records[:4]).rows[0].speed.cell() == "99.00"  # a single run: no range
