"""The house limits on size, checked: no module over 450 lines and no class over 350 (from its `class` line to
its last), in the package and in the tools beside it (scripts/, benchmarks/ but its results, examples/); no C
source or header of the package's kernels over 450 lines either (one file per level, as ggml-cpu's arch/). A
file that grows past them is split by what it does. `Engine` has a limit of its own, 320 lines, and no public
attributes: what other code reads of it goes through its documented calls. Files are only read, never imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["tokenrouter", "scripts", "benchmarks", "examples"]
EXCLUDED = [ROOT / "benchmarks" / "results"]  # what the benchmarks wrote, not code of ours
MODULE_LINES = 450
CLASS_LINES = 350
ENGINE = ROOT / "tokenrouter" / "api" / "engine.py"
ENGINE_LINES = 320  # its parts go to the modules beside it (api/), not into it


def over_the_limits(source: str) -> list[str]:
    """What in `source` is over the limits: the module's line count, and each class (nested ones too) whose
    lines from its `class` line to its end are too many."""
    problems = []
    lines = len(source.splitlines())
    if lines > MODULE_LINES:
        problems.append(f"{lines} lines (a module may have {MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            length = node.end_lineno - node.lineno + 1
            if length > CLASS_LINES:
                problems.append(f"class {node.name}: {length} lines (a class may have {CLASS_LINES})")
    return problems


def public_attributes(cls: ast.ClassDef) -> list[str]:
    """The public data attributes a class sets: names bound in its body, and `self.<name> = ...` in its methods."""
    names = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        for n in (n for t in targets for n in ast.walk(t)):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                names.add(n.attr)
    return sorted(n for n in names if not n.startswith("_"))


def modules(folder: str) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py")) if not any(p.is_relative_to(e) for e in EXCLUDED)]


def _class(name: str, body_lines: int, indent: str = "") -> str:
    return f"{indent}class {name}:\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))


def test_the_measure_finds_what_is_over_the_limits():
    assert over_the_limits(_class("Fits", CLASS_LINES - 1)) == []  # 350 lines with its `class` line
    assert over_the_limits(_class("Long", CLASS_LINES) + "\n\n" + _class("Short", 3)) == [
        "class Long: 351 lines (a class may have 350)"
    ]
    nested = "def f():\n" + _class("Inner", CLASS_LINES, indent="    ")
    assert over_the_limits(nested) == ["class Inner: 351 lines (a class may have 350)"]
    long_module = "".join(f"x{i} = {i}\n" for i in range(MODULE_LINES + 1))
    assert over_the_limits(long_module) == ["451 lines (a module may have 450)"]
    assert over_the_limits(long_module[: long_module.index("x450")]) == []


def test_the_measure_finds_public_attributes():
    source = (
        "class C:\n    shown = 1\n    _kept: int = 2\n"
        "    def __init__(self):\n        self.a, self._b = 1, 2\n        self.c: int = 3\n        self._d = 4\n"
        "    def m(self, other):\n        self.e += 1\n        other.f = 5\n        x = 6\n"
    )
    [cls] = ast.parse(source).body
    assert public_attributes(cls) == ["a", "c", "e", "shown"]


def test_the_engine_is_within_its_own_limit_and_keeps_its_parts_private():
    [engine] = [n for n in ast.parse(ENGINE.read_text(encoding="utf-8")).body if getattr(n, "name", "") == "Engine"]
    lines = engine.end_lineno - engine.lineno + 1
    assert lines <= ENGINE_LINES, (
        f"class Engine: {lines} lines (it may have {ENGINE_LINES}); move a concern out to api/"
    )
    public = public_attributes(engine)
    assert not public, f"Engine has public attributes {public}: keep them private, and read them through a method"


def test_no_c_source_is_over_the_module_limit():
    sources = sorted([*(ROOT / "tokenrouter").rglob("*.c"), *(ROOT / "tokenrouter").rglob("*.h")])
    assert sources, "no C sources under tokenrouter/"
    lines = {p.relative_to(ROOT): len(p.read_text(encoding="utf-8").splitlines()) for p in sources}
    bad = [f"{p}: {n} lines (a file may have {MODULE_LINES})" for p, n in lines.items() if n > MODULE_LINES]
    assert not bad, "over the house limits (split by what it does):\n" + "\n".join(bad)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_or_class_is_over_the_limits(folder):
    found = modules(folder)
    assert found, f"no Python files under {folder}/"
    bad = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in found
        for problem in over_the_limits(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "over the house limits (split by what it does):\n" + "\n".join(bad)
