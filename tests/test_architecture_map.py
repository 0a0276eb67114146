"""docs/architecture.md's map is true to the tree: the packages and engine rooms its tables name
exist, and its "What each file owns" lists every module under tokenrouter/ exactly once, under
the heading of its directory, and nothing that is gone. Files are only read, never imported."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tokenrouter"
DOC = ROOT / "docs" / "architecture.md"
DOC_NAME = "docs/architecture.md"
FILES_SECTION = "What each file owns"

ENTRY = re.compile(r"^[-*] `([^`]+)`(.*)$")
GROUP = re.compile(r"^### (.*)$")


def sections(text: str) -> dict[str, str]:
    """The doc's `## ` sections by title (the text up to the next `## `)."""
    out, title, lines = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            if title is not None:
                out[title] = "\n".join(lines)
            title, lines = line[3:].strip(), []
        elif title is not None:
            lines.append(line)
    if title is not None:
        out[title] = "\n".join(lines)
    return out


def doc_sections() -> dict[str, str]:
    found = sections(DOC.read_text(encoding="utf-8"))
    assert FILES_SECTION in found, f"{DOC_NAME} has no '## {FILES_SECTION}' section"
    assert "The packages" in found, f"{DOC_NAME} has no '## The packages' section"
    return found


def only_reexports(path: Path) -> bool:
    """An `__init__.py` that is empty or holds only a docstring, imports and dunder assignments
    (`__all__`, `__all__ +=`, `__version__`): nothing of its own to own."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets = [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else targets
        if targets and all(isinstance(t, ast.Name) and t.id.startswith("__") and t.id.endswith("__") for t in targets):
            continue
        return False
    return True


def modules() -> set[str]:
    """Every module the list must hold, relative to tokenrouter/: each `.py` (but an `__init__.py`
    that only re-exports) and each `.c`."""
    out = set()
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c")]:
        if "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py" and only_reexports(path):
            continue
        out.add(path.relative_to(PACKAGE).as_posix())
    return out


def listed() -> list[tuple[str, str, str]]:
    """(path, the `###` group it is under, what follows the path) for each entry of the list."""
    out, group = [], ""
    for line in doc_sections()[FILES_SECTION].splitlines():
        if m := GROUP.match(line):
            group = m.group(1).strip()
        elif m := ENTRY.match(line.strip()):
            out.append((m.group(1), group, m.group(2)))
    return out


def group_dir(heading: str) -> str:
    """The directory a `###` heading stands for: its backticked `dir/`, else the top level."""
    m = re.search(r"`([^`]+)/`", heading)
    return m.group(1) if m else ""


def test_every_module_is_listed_exactly_once():
    entries = [path for path, _, _ in listed()]
    assert entries, f"'## {FILES_SECTION}' in {DOC_NAME} lists no files (lines like '- `api/engine.py`: ...')"
    required = modules()
    twice = sorted(p for p, n in Counter(entries).items() if n > 1)
    missing = sorted(required - set(entries))
    assert not twice, f"listed more than once in {DOC_NAME}'s '{FILES_SECTION}'; keep one line each: {twice}"
    assert not missing, (
        f"modules under tokenrouter/ missing from {DOC_NAME}'s '{FILES_SECTION}': add one line each, "
        f"'- `<path>`: <what it owns>', under the heading of its directory: {missing}"
    )


def test_every_listed_path_is_a_module():
    required = modules()
    gone = sorted(p for p, _, _ in listed() if not (PACKAGE / p).is_file())
    assert not gone, (
        f"{DOC_NAME}'s '{FILES_SECTION}' lists files that do not exist under tokenrouter/ "
        f"(removed or renamed? remove or fix their lines): {gone}"
    )
    reexports = sorted(p for p, _, _ in listed() if p not in required)
    assert not reexports, (
        f"{DOC_NAME}'s '{FILES_SECTION}' lists __init__.py files that only re-export (or files that are "
        f"not .py/.c modules); remove their lines: {reexports}"
    )


def test_every_entry_says_what_it_owns_under_its_directory():
    unsaid, misplaced = [], []
    for path, group, rest in listed():
        if not re.match(r"^:\s*\S", rest):
            unsaid.append(path)
        parent = Path(path).parent.as_posix()
        parent = "" if parent == "." else parent
        if group_dir(group) != parent:
            home = f"### `{parent}/`" if parent else "### The top level"
            misplaced.append(f"`{path}` (under '### {group}'; belongs under '{home}')")
    assert not unsaid, f"{DOC_NAME}: these lines must say what the file owns, '- `<path>`: <what it owns>': {unsaid}"
    assert not misplaced, f"{DOC_NAME}: move these lines under the heading of their directory: {misplaced}"


def tables(section: str) -> list[list[list[str]]]:
    """The markdown tables of a section: rows of cells, header and separator left out."""
    out, rows = [], None
    for line in section.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []  # the header
            elif not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows is not None:
            out.append(rows)
            rows = None
    if rows is not None:
        out.append(rows)
    return out


def named(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def packages_and_rooms() -> tuple[list[list[str]], list[list[str]]]:
    found = tables(doc_sections()["The packages"])
    assert len(found) >= 2, f"{DOC_NAME}'s '## The packages' should hold two tables: the packages, then engine/'s rooms"
    return found[0], found[1]


def test_the_packages_table_names_what_exists_and_all_of_it():
    packages, _ = packages_and_rooms()
    names = [n for row in packages for n in named(row[0])]
    gone = sorted(n for n in names if not (PACKAGE / n.rstrip("/")).exists())
    assert not gone, f"{DOC_NAME}'s packages table names what is not under tokenrouter/ (remove or rename): {gone}"
    present = {n.rstrip("/") for n in names}
    dirs = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}
    files = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    unnamed = sorted({f"{d}/" for d in dirs - present} | (files - present))
    assert not unnamed, f"{DOC_NAME}'s packages table does not name these parts of tokenrouter/; add them: {unnamed}"


def test_the_rooms_table_names_what_exists_and_all_of_it():
    _, rooms = packages_and_rooms()
    engine = PACKAGE / "engine"
    names, top = [], []
    for row in rooms:
        if named(row[0]):
            names += named(row[0])
        else:  # "(top)": the files at engine/'s top, named in the second column
            top += [n for n in named(row[1]) if n.endswith(".py")]
    gone = sorted(n for n in names if not (engine / n.rstrip("/")).is_dir())
    gone += sorted(f"(top) {n}" for n in top if not (engine / n).is_file())
    assert not gone, f"{DOC_NAME}'s rooms table names what is not under tokenrouter/engine/ (remove or rename): {gone}"
    rooms_present = {n.rstrip("/") for n in names}
    unnamed = sorted(
        f"{p.name}/"
        for p in engine.iterdir()
        if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py")) and p.name not in rooms_present
    )
    assert not unnamed, f"{DOC_NAME}'s rooms table does not name these rooms of engine/; add them: {unnamed}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen, fenced = set(), Counter(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.*)$", line)):
            s = slug(m.group(1))
            out.add(s if not seen[s] else f"{s}-{seen[s]}")
            seen[s] += 1
    return out


def test_the_maps_relative_links_resolve():
    text = DOC.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL
        file, _, anchor = target.partition("#")
        path = (DOC.parent / file).resolve() if file else DOC
        if not path.exists():
            broken.append(f"{target} (no file {file})")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no heading with anchor #{anchor} in {path.name})")
    assert not broken, f"{DOC_NAME} links to what is not there: {broken}"
