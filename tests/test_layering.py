"""The shape of the code: dependencies point one way (the import-linter contract in pyproject.toml),
and no module reaches into another's `_`-prefixed members."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Names of other modules that code here may use although they start with "_": oneDNN's linear
# kernels have no public name in torch (engine/model/linear/onednn.py).
ALLOWED_PRIVATE = {("torch.ops.mkldnn", "_reorder_linear_weight"), ("torch.ops.mkldnn", "_linear_pointwise")}


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every `x._name` where x is not self or cls, and every `from m import _name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if (ast.unparse(base), node.attr) in ALLOWED_PRIVATE:
                continue
            found.append((node.lineno, f"{ast.unparse(base)}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom):
            found += [
                (node.lineno, f"from {node.module} import {a.name}")
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_the_check_finds_what_it_looks_for():
    code = "import m\nfrom m import _x\nclass A:\n    def f(self, o):\n        return self._a, o._b, m.ok\n"
    assert private_uses(code) == [(2, "from m import _x"), (5, "o._b")]


@pytest.mark.parametrize("folder", ["tokenrouter", "benchmarks"])
def test_no_module_touches_another_modules_private_members(folder):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, what in private_uses(path.read_text())
    ]
    assert not bad, "private members used from outside their module:\n" + "\n".join(bad)


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the package at `root` (its pyproject.toml's contract)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


def test_dependencies_point_one_way():
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 kept, 0 broken" in res.stdout


def test_the_contract_catches_a_reversed_import(tmp_path):
    """The engine importing the API (upward) breaks the contract."""
    shutil.copytree(ROOT / "tokenrouter", tmp_path / "tokenrouter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    core = tmp_path / "tokenrouter" / "engine" / "model_core.py"
    core.write_text(core.read_text() + "\nfrom ..api import Engine  # noqa: E402\n")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    assert "tokenrouter.engine.model_core -> tokenrouter.api" in res.stdout, res.stdout
