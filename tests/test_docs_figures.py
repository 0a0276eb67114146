"""The docs' figures stay traceable: every benchmarks/ path they name exists, every table of
figures names its script and raw results, the references stay short, no text names a session,
and every link into a doc lands on a heading."""

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCES = {"benchmarks.md": 600, "evaluation.md": 400}

# A path starts at "benchmarks/" (or "../benchmarks/" from docs/), not inside another path.
PATH = re.compile(r"(?<![\w./-])(?:\.\./)?benchmarks/[\w./{},*-]*")
SCRIPT = re.compile(r"(?<![\w./-])benchmarks/[\w/-]+\.py\b|\btokenrouter (?:bench|eval)\b")
RESULTS = re.compile(r"(?<![\w./-])benchmarks/results/")
# A figure: a cell that is a number, a ratio, a share or a count of a total, maybe in bold.
FIGURE = re.compile(r"^\**[-+]?\d[\d.,]*\s*(x|%|ms|us|s|GB|/\d+)?\**$")
LINK = re.compile(r"\]\(([^)\s#]*\.md)?#([^)\s]+)\)")


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [p for alt in match.group(1).split(",") for p in expand_braces(head + alt + tail)]


def named_paths(path: Path) -> list[str]:
    found = []
    body = text(path)
    for match in PATH.finditer(body):
        cleaned = match.group().rstrip(".,:;")
        if body[match.end() : match.end() + 1] == "<":  # a template, "results/gpu-<date>/": its folder
            cleaned = cleaned[: cleaned.rfind("/") + 1]
        if cleaned.startswith("../"):
            cleaned = cleaned[3:]
        found.append(cleaned)
    return found


def exists(pattern: str) -> bool:
    for candidate in expand_braces(pattern):
        if any(ch in candidate for ch in "*?["):
            if not glob.glob(str(ROOT / candidate)):
                return False
        elif not (ROOT / candidate).exists():
            return False
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_benchmarks_path_named_exists(doc):
    missing = sorted({p for p in named_paths(doc) if not exists(p)})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def sections(doc: Path) -> list[tuple[str, list[str]]]:
    """(heading, lines) for each heading of any level, code blocks kept in their section."""
    out, heading, lines, fence = [], "(top)", [], False
    for line in text(doc).splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"^#{1,6} ", line):
            out.append((heading, lines))
            heading, lines = line.lstrip("#").strip(), []
        else:
            lines.append(line)
    out.append((heading, lines))
    return out


def holds_figures(lines: list[str]) -> bool:
    for line in lines:
        if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if any(FIGURE.match(c) for c in cells):
                return True
    return False


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_each_table_of_figures_names_its_script_and_results(name):
    unsourced = []
    for heading, lines in sections(ROOT / "docs" / name):
        if holds_figures(lines):
            body = "\n".join(lines)
            if not SCRIPT.search(body) or not RESULTS.search(body):
                unsourced.append(heading)
    assert not unsourced, f"docs/{name}: sections with figures but no script or results path: {unsourced}"


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_references_stay_short(name):
    lines = len(text(ROOT / "docs" / name).splitlines())
    assert lines <= REFERENCES[name], f"docs/{name} has {lines} lines, at most {REFERENCES[name]}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_text_names_a_session(doc):
    # The plural stays: the agentic workloads' unit is a session of turns (bench/sessions.py).
    hits = [line for line in text(doc).splitlines() if re.search(r"\bsession\b", line, re.IGNORECASE)]
    assert not hits, f"{doc.name} names a session: {hits}"


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors: lower-case, punctuation dropped, spaces to dashes, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in text(doc).splitlines():
        if line.startswith("```"):
            fence = not fence
        match = None if fence else re.match(r"^#{1,6} (.*)$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_to_a_heading_resolves(doc):
    broken = []
    for target, anchor in LINK.findall(text(doc)):
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{target}#{anchor} (no such file)")
        elif anchor not in anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{doc.name} links to headings that do not exist: {broken}"


def test_a_broken_path_and_an_unsourced_table_are_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("## T\n\n| a | b |\n|---|---:|\n| x | 1.07x |\n\nsee benchmarks/results/no-such/x.json\n")
    assert named_paths(doc) == ["benchmarks/results/no-such/x.json"]
    assert not exists("benchmarks/results/no-such/x.json")
    assert holds_figures(sections(doc)[1][1])
    assert not SCRIPT.search(text(doc))
    assert anchors(doc) == {"t"}
