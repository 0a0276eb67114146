"""The shape of the code: dependencies point one way (the import-linter contracts in pyproject.toml,
which place every module of the package, of the engine and of the API, and count imports made
only for type checking too), and no module reaches into another's `_`-prefixed members."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Names of other modules that code here may use although they start with "_": torch's CPU kernels
# for packed and low-bit linear layers have no public name (engine/quant/), nor has the
# constructor of a wrapper tensor subclass (testing/accelerator.py).
ALLOWED_PRIVATE = {
    ("torch.Tensor", "_make_wrapper_subclass"),
    ("torch.ops.mkldnn", "_reorder_linear_weight"),
    ("torch.ops.mkldnn", "_linear_pointwise"),
    ("torch.ops.aten", "_weight_int4pack_mm_for_cpu"),
    ("torch.ops.aten", "_convert_weight_to_int4pack_for_cpu"),
    ("torch.ops.aten", "_weight_int8pack_mm"),
    # LangChain's chat-model hooks for subclasses (langchain/chat_model.py): an override extends its parent's
    ("super()", "_create_chat_result"),
    ("super()", "_convert_chunk_to_generation_chunk"),
    ("super()", "_get_ls_params"),
    # flashinfer's JIT generators of the FA2 prefill variants it picks at run time (the GPU kit builds and probes
    # them: scripts/gpu_kit/jit_modules.py)
    ("flashinfer.jit.attention.modules", "_gen_batch_prefill_primary_module"),
    ("flashinfer.jit.attention.modules", "_gen_batch_prefill_independent_paged_module"),
    ("flashinfer.jit.attention.modules", "_gen_batch_prefill_independent_full_module"),
}


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


@pytest.mark.parametrize("folder", ["tokenrouter", "benchmarks", "scripts", "tests", "examples"])
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
        [str(LINT_IMPORTS), str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


def test_dependencies_point_one_way():
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 kept, 0 broken" in res.stdout


BREAKS = [
    # the engine importing the API (upward)
    ("engine/model_core.py", "from ..api import Engine", "tokenrouter.engine.model_core -> tokenrouter.api"),
    # a policy importing the engine, if only to type a parameter: the package cycle counts
    (
        "policies/speculative.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine.sequence import Sequence",
        "tokenrouter.policies.speculative -> tokenrouter.engine.sequence",
    ),
    # a room of the engine importing the worker above it
    ("engine/kv/cache.py", "from ..worker import thread", "tokenrouter.engine.kv.cache -> tokenrouter.engine.worker"),
]


@pytest.mark.parametrize("path, line, expected", BREAKS, ids=["upward", "type-checking", "room"])
def test_the_contracts_catch_an_import_against_the_layers(tmp_path, path, line, expected):
    shutil.copytree(ROOT / "tokenrouter", tmp_path / "tokenrouter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    module = tmp_path / "tokenrouter" / path
    module.write_text(module.read_text() + "\n" + line + "  # noqa\n")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    assert expected in res.stdout, res.stdout


def test_a_module_the_contracts_do_not_place_breaks_them(tmp_path):
    """The contracts are exhaustive: a new top-level module must be given its layer."""
    shutil.copytree(ROOT / "tokenrouter", tmp_path / "tokenrouter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tokenrouter" / "stray.py").write_text('"""Placed nowhere."""\n')
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    assert "tokenrouter.stray" in res.stdout, res.stdout
