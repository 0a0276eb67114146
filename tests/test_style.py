"""The code's habits, checked: ruff's lint selection (pyproject.toml) and its formatter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"
FOLDERS = ["tokenrouter", "tests", "benchmarks", "scripts", "examples"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True)


def test_lint_is_clean():
    res = _ruff("check", "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr


def test_format_is_clean():
    res = _ruff("format", "--check", "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr
