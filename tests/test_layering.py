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

from tests.faces_contract import crossing

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tokenrouter"
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
        env={"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin"},  # ROOT: tests.faces_contract
    )


def test_dependencies_point_one_way():
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 kept, 0 broken" in res.stdout


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
    # a package's file imported past its face, from outside the package
    ("api/launch.py", "from ..engine.kv.cache import KVCache", "tokenrouter.api.launch -> tokenrouter.engine.kv.cache"),
    # a room's file importing the face of the package that holds it (a circle through the face)
    ("engine/kv/cache.py", "from .. import ModelCore", "tokenrouter.engine.kv.cache -> tokenrouter.engine "),
]


@pytest.mark.parametrize(
    "path, line, expected", BREAKS, ids=["upward", "type-checking", "room", "past-the-face", "own-face"]
)
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


def test_the_face_rule_reaches_one_step_below_what_both_share():
    assert not crossing("tokenrouter.api.launch", "tokenrouter.engine")
    assert not crossing("tokenrouter.engine.model_core", "tokenrouter.engine.kv")
    assert not crossing("tokenrouter.engine.kv.cache", "tokenrouter.engine.kv.block_manager")
    assert not crossing("tokenrouter.engine.kv", "tokenrouter.engine.kv.cache")  # a face imports its files
    assert crossing("tokenrouter.api.launch", "tokenrouter.engine.model_core")
    assert crossing("tokenrouter.engine.model_core", "tokenrouter.engine.kv.cache")
    assert crossing("tokenrouter.engine.kv.cache", "tokenrouter.engine")  # its own package's face


def test_every_package_has_a_face():
    """Each package and room of the engine has an `__init__.py` under 40 lines that names what
    it exports (`__all__`), and exports only names it imports."""
    bad = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        where = init.relative_to(ROOT)
        text = init.read_text()
        if len(text.splitlines()) >= 40:
            bad.append(f"{where}: {len(text.splitlines())} lines")
        tree = ast.parse(text)
        exported = [
            e.value
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AugAssign))
            and "__all__" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            for e in ast.walk(node.value)
            if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
        imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        defined = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if not exported:
            bad.append(f"{where}: no __all__")
        bad += [
            f"{where}: exports {name!r}, which it does not import"
            for name in exported
            if name not in imported | defined
        ]
    assert not bad, "faces:\n" + "\n".join(bad)


def test_examples_import_only_faces():
    """A user's code (examples/) reaches the package through its faces, never a file inside one."""
    bad = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}"
        for path in sorted((ROOT / "examples").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenrouter")
        if not (ROOT / node.module.replace(".", "/")).is_dir()
    ]
    assert not bad, "examples importing past a face:\n" + "\n".join(bad)


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (Tarjan's strongly connected
    components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in imports.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(group) > 1 or v in imports.get(v, ()):
                found.append(sorted(group))

    for v in sorted(imports):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_circle():
    """No two modules import each other, however far round, imports for type checking and inside
    functions included (the contracts order packages and rooms, not the modules inside a room)."""
    import grimp

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    graph = grimp.build_graph("tokenrouter", include_external_packages=False)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert circles(imports) == []
