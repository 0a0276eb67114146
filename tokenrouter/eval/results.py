"""results.jsonl: every record of an evaluation, appended as it happens, the only source of the report.

One JSON object per line, each with a "type":

- "run" (the first line): what the results depend on: prompt version, max_tokens, the models
  (fingerprint, FLOPs per token, description), the problems file, the sandbox's limits. A run
  resumes only into a file whose "run" record matches; `check_resumable` says what differs.
- "system": a system was started (its spec, policy, router fingerprint, the engine's dtypes).
- "problem": one (system, task_id) done: the verdict, the completion, tokens per model, tokens
  processed per model, hand-offs, the engine steps per model since the previous record.
- "segment": a system's quality phase of one sitting ended (problems, wall time).
- "speed": a system's speed phase (closed loop at C in flight), with the date and the machine.

Each line is written whole, flushed and fsynced as its problem ends, so an interrupted run loses
at most the problems in flight; a line cut short by a crash is ignored on reading and removed
before the next append.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from ..errors import ConfigError

RESULTS = "results.jsonl"
FORMAT = 1
# The parts of the "run" record that the numbers depend on: a resume must agree on all of them.
MUST_MATCH = ("format", "prompt_version", "max_tokens", "precision", "models", "data", "sandbox")


class ResultsFile:
    """Append-only JSON lines, safe to append to from several threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def read(self) -> list[dict]:
        """Every complete record; a last line cut short (a crash mid-write) is skipped."""
        if not self.path.is_file():
            return []
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        records = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                if lineno == len(lines):  # the unfinished last line of an interrupted run
                    break
                raise ConfigError(f"{self.path}:{lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
        return records

    def _repair(self) -> None:
        """Cut an unfinished last line, so the next record starts on a line of its own."""
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._repair()
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())


def header(records: list[dict]) -> dict | None:
    return records[0] if records and records[0].get("type") == "run" else None


def _differences(old, new, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{where}.{k}" if where else k)
        return out
    return [] if old == new else [f"{where}: {json.dumps(old)} there, {json.dumps(new)} now"]


def identity(run: dict) -> dict:
    """What of a "run" record the numbers depend on: not where the models or the data are, but
    what they are (fingerprints)."""
    out = {k: run.get(k) for k in MUST_MATCH}
    out["models"] = {m: info.get("fingerprint") for m, info in (run.get("models") or {}).items()}
    out["data"] = (run.get("data") or {}).get("fingerprint")
    return out


def check_resumable(path: Path, old: dict, new: dict) -> None:
    """Refuse to mix results of different configurations in one file."""
    diffs = _differences(identity(old), identity(new))
    if diffs:
        raise ConfigError(
            f"{path} holds results of another configuration ({'; '.join(diffs[:4])}"
            f"{'; ...' if len(diffs) > 4 else ''}); resume with the same settings, or write to another --out"
        )


def done_keys(records: list[dict]) -> set[tuple[str, str]]:
    return {(r["system"], r["task_id"]) for r in records if r.get("type") == "problem"}


def model_fingerprint(path: str | Path) -> str:
    """A cheap fingerprint of a model: its config, its tensor tables and 8 MiB sampled evenly
    from each weight file (hashing gigabytes on every resume would take a minute)."""
    path = Path(path)
    h = hashlib.sha256()
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf", ".json") and p.is_file())
    )
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}\n".encode())
        with open(f, "rb") as fh:
            if f.suffix == ".json" or size <= 8 << 20:
                h.update(fh.read())
                continue
            for i in range(8):
                fh.seek((size - (1 << 20)) * i // 7)
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def portable(text: str | Path) -> str:
    """`text` (a path, or a command line naming paths) with this machine's places written so a
    reader elsewhere can follow them and they say nothing of the machine: the working directory
    dropped (relative paths), the store's home as $TOKENROUTER_HOME, the user's home as ~."""
    from ..store import home_dir

    out = str(text)
    for place, name in ((Path.cwd(), ""), (home_dir(), "$TOKENROUTER_HOME/"), (Path.home(), "~/")):
        out = out.replace(f"{Path(place).resolve()}/", name).replace(f"{place}/", name)
    return out
